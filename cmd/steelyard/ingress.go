package main

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/steelyard-net/steelyard/controller/ingress"
)

// ingressFlags configure the L7 layer (nginx driven by Ingresses).
type ingressFlags struct {
	enabled   bool
	nginx     string
	dir       string
	class     string
	configMap string
	upstreams string
	httpPort  int
	httpsPort int
	// httpRoutes, when set, adds the Gateway API HTTPRoutes to the config
	// (--gateway too); ctrl is the running controller, for poke.
	httpRoutes func([]*corev1.Service) []ingress.HTTPRoute
	ctrl       atomic.Pointer[ingress.Controller]
}

// poke asks the nginx layer for a render (a Gateway API object changed).
func (f *ingressFlags) poke() {
	if c := f.ctrl.Load(); c != nil {
		c.Trigger()
	}
}

func (f *ingressFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.BoolVar(&f.enabled, "ingress", false, "serve Ingresses of the steelyard IngressClass through nginx (needs the API server as source)")
	fl.StringVar(&f.nginx, "nginx", "nginx", "nginx binary (--ingress)")
	fl.StringVar(&f.dir, "nginx-dir", "/run/steelyard/nginx", "nginx's working directory: nginx.conf, certs/ (0600 files), temporary files (--ingress)")
	fl.StringVar(&f.class, "ingress-class", "", "serve only the IngressClass of this name (its controller must be "+ingress.ControllerName+"); empty: every such class")
	fl.StringVar(&f.configMap, "ingress-configmap", "", "namespace/name of the ConfigMap of nginx settings (--ingress); empty: defaults")
	fl.StringVar(&f.upstreams, "ingress-upstreams", ingress.UpstreamsVIP, "vip: proxy to the Service VIP (endpoint changes never reload nginx); pods: list pod IPs and reload on every endpoint change (baseline for comparison)")
	fl.IntVar(&f.httpPort, "ingress-http-port", 80, "port nginx serves HTTP on")
	fl.IntVar(&f.httpsPort, "ingress-https-port", 443, "port nginx serves HTTPS on")
}

// start starts the Ingress controller and nginx when --ingress is set;
// they run until ctx is done, and the returned wait blocks until nginx has
// stopped (call it before exiting, so no worker outlives the agent).
// manifests is the --manifests value: the L7 layer needs the API server.
func (f *ingressFlags) start(ctx context.Context, kubeconfig, manifests, nodeName string, reg prometheus.Registerer) (wait func(), err error) {
	wait = func() {}
	if !f.enabled {
		return wait, nil
	}
	defer func() {
		if err != nil {
			wait = func() {}
		}
	}()
	if manifests != "" {
		return wait, errors.New("--ingress needs the API server as source, not --manifests")
	}
	for _, p := range []int{f.httpPort, f.httpsPort} {
		if p < 1 || p > 65535 {
			return wait, fmt.Errorf("--ingress-http-port/--ingress-https-port %d: want 1 to 65535", p)
		}
	}
	client, err := newClient(kubeconfig)
	if err != nil {
		return wait, err
	}
	nginx, err := ingress.NewNginx(f.nginx, f.dir, ingress.NewNginxMetrics(reg))
	if err != nil {
		return wait, err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "steelyard-ingress", Host: nodeName})
	c, err := ingress.New(client, ingress.Config{
		Class:     f.class,
		ConfigMap: f.configMap,
		Render:    ingress.Options{Upstreams: f.upstreams, HTTPPort: f.httpPort, HTTPSPort: f.httpsPort},
		// Bursts merge, as in the L4 loop; a short period keeps the
		// pods-mode baseline honest (it reloads per change).
		MinSyncPeriod: minIngressSyncPeriod,
		HTTPRoutes:    f.httpRoutes,
	}, nginx, recorder, reg)
	if err != nil {
		return wait, err
	}
	if err := c.Start(ctx); err != nil {
		return wait, fmt.Errorf("ingress: %w", err)
	}
	f.ctrl.Store(c)
	log.WithFields(map[string]any{"nginx": f.nginx, "nginx-dir": nginx.Dir, "upstreams": f.upstreams, "class": f.class}).Info("ingress layer started")
	return func() {
		select {
		case <-nginx.Done():
		case <-time.After(15 * time.Second):
			log.Warn("nginx did not stop in time")
		}
	}, nil
}

// minIngressSyncPeriod is the minimum time between two renders.
const minIngressSyncPeriod = 100 * time.Millisecond
