package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/controller/gateway"
	"github.com/steelyard-net/steelyard/controller/ingress"
)

// gatewayFlags configure the Gateway API layer (TCPRoute and UDPRoute in
// the kernel).
type gatewayFlags struct {
	enabled   bool
	pool      string
	leaseNS   string
	parsedNet netip.Prefix
	// http: the nginx layer runs too (--ingress), so HTTP listeners
	// accept HTTPRoutes; src is the running source.
	http bool
	src  *gateway.Source
	// httpPortBase is --gateway-http-port-base; nodeAddrs are the node's
	// addresses (set by run), where HTTP listeners are forwarded to nginx.
	httpPortBase int
	nodeAddrs    func() []netip.Addr
}

// httpRoutes returns what the nginx layer renders for the Gateway API
// (nil without --gateway).
func (f *gatewayFlags) httpRoutes() func([]*corev1.Service) []ingress.HTTPRoute {
	if f.src == nil || !f.http {
		return nil
	}
	return f.src.HTTPRoutes
}

func (f *gatewayFlags) register(cmd *cobra.Command, run bool) {
	fl := cmd.Flags()
	fl.BoolVar(&f.enabled, "gateway", false, "serve Gateway API TCPRoutes and UDPRoutes of GatewayClasses with controllerName "+string(gateway.ControllerName)+" (needs the API server and the Gateway API CRDs); with --ingress also HTTPRoutes on HTTP listeners, through nginx")
	fl.StringVar(&f.pool, "gateway-address-pool", "", "CIDR that Gateways without spec.addresses get an address from; empty: none")
	fl.IntVar(&f.httpPortBase, "gateway-http-port-base", gateway.DefaultHTTPPortBase, "first port nginx serves HTTP/HTTPS listeners on, one per Gateway and listener port; the Gateway address's listener port is forwarded to it (--ingress)")
	if run {
		fl.StringVar(&f.leaseNS, "gateway-lease-namespace", "steelyard", "namespace of the Lease that elects the one agent writing Gateway API status")
	} else {
		fl.BoolVar(&f.http, "gateway-http", false, "the agents run with --ingress too: expect HTTP/HTTPS listeners forwarded to nginx")
	}
}

func (f *gatewayFlags) check(manifests string) error {
	if !f.enabled {
		return nil
	}
	if manifests != "" {
		return errors.New("--gateway needs the API server as source, not --manifests")
	}
	if f.httpPortBase < 0 || f.httpPortBase > 65535 {
		return fmt.Errorf("--gateway-http-port-base %d: want 1 to 65535", f.httpPortBase)
	}
	p, err := gateway.ParsePool(f.pool)
	f.parsedNet = p
	return err
}

// clients connects to the API server with the Gateway API clientset too.
func (f *gatewayFlags) clients(kubeconfig string) (versioned.Interface, kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	// Gateway API types are CRDs: JSON only.
	gw, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubeClient(cfg)
	return gw, kube, err
}

// start watches the Gateway API objects, makes the agent's syncs program
// their routes (changes trigger the sync runner, as Service changes do),
// and campaigns for the status writer's Lease.
// It returns a wait that blocks (at most 5 s) until the Lease is released.
func (f *gatewayFlags) start(ctx context.Context, kubeconfig, nodeName string, agent *controller.Agent, trigger func()) (wait func(), err error) {
	wait = func() {}
	if !f.enabled {
		return wait, nil
	}
	gw, kube, err := f.clients(kubeconfig)
	if err != nil {
		return wait, err
	}
	src := gateway.NewSource(gw, kube, f.parsedNet)
	src.ServeHTTP = f.http
	src.HTTPPortBase, src.NodeAddrs = int32(f.httpPortBase), f.nodeAddrs
	f.src = src
	w := &gateway.StatusWriter{Source: src, GW: gw, Kube: kube, Identity: nodeName, Namespace: f.leaseNS}
	if err := w.Run(ctx); err != nil {
		return wait, err
	}
	wait = func() {
		select {
		case <-w.Done():
		case <-time.After(5 * time.Second):
			log.Warn("the status Lease was not released in time")
		}
	}
	if err := src.Start(ctx, trigger); err != nil {
		return wait, fmt.Errorf("gateway: %w", err)
	}
	agent.Routes = src
	log.WithField("pool", f.pool).Info("Gateway API layer started")
	return wait, nil
}

// routes lists the Gateway API objects once and gives their routes to
// builder (for verify).
func (f *gatewayFlags) routes(ctx context.Context, kubeconfig string, svcs []*corev1.Service, builder *controller.Builder) error {
	if !f.enabled {
		return nil
	}
	gw, kube, err := f.clients(kubeconfig)
	if err != nil {
		return err
	}
	in, err := gateway.List(ctx, gw, kube, svcs, f.parsedNet, f.http)
	if err != nil {
		return err
	}
	in.HTTPPortBase = int32(f.httpPortBase)
	if f.nodeAddrs != nil {
		in.NodeAddrs = f.nodeAddrs()
	}
	builder.SetRoutes(gateway.Translate(in).Routes)
	return nil
}
