package gateway

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"
	gwlisters "sigs.k8s.io/gateway-api/pkg/client/listers/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/controller/ingress"
)

var log = logrus.WithField("subsys", "gateway")

// Log field keys.
const (
	fieldObject = "object"
	fieldKind   = "kind"
)

// Source watches the Gateway API objects (typed informers of
// sigs.k8s.io/gateway-api) and Namespaces, and gives the agent's sync the
// routes of each snapshot (controller.RouteSource). Every agent runs one:
// all nodes program the same routes. The status of each snapshot goes to a
// StatusWriter, which writes only on the leader.
type Source struct {
	pool netip.Prefix
	kube kubernetes.Interface
	// ServeHTTP makes HTTP listeners accept HTTPRoutes (the nginx layer
	// runs); set it before Start. It also watches kubernetes.io/tls
	// Secrets, for the ResolvedRefs of HTTPS listeners.
	ServeHTTP bool
	// NodeAddrs returns this node's addresses, where HTTP listeners are
	// forwarded to nginx (nil: none, and no forward).
	NodeAddrs func() []netip.Addr
	// HTTPPortBase is the first nginx port of HTTP listeners (0: default).
	HTTPPortBase int32

	gwFactory   gwinformers.SharedInformerFactory
	kubeFactory informers.SharedInformerFactory
	// secretFactory watches TLS Secrets (ServeHTTP only).
	secretFactory informers.SharedInformerFactory
	classes       gwlisters.GatewayClassLister
	gateways      gwlisters.GatewayLister
	tcpRoutes     gwlisters.TCPRouteLister
	udpRoutes     gwlisters.UDPRouteLister
	httpRoutes    gwlisters.HTTPRouteLister
	grants        gwlisters.ReferenceGrantLister
	namespaces    corelisters.NamespaceLister
	secrets       corelisters.SecretLister
	slices        discoverylisters.EndpointSliceLister
	synced        []cache.InformerSynced

	mu sync.Mutex
	// pending is the Result of the last Routes call, last the one whose
	// routes the dataplane applied (what status reports).
	pending, last *Result
	onDone        func()
}

// NewSource returns a source over the clients; Start begins the watch.
// pool is --gateway-address-pool (zero: none).
func NewSource(gw versioned.Interface, kube kubernetes.Interface, pool netip.Prefix) *Source {
	s := &Source{pool: pool, kube: kube, onDone: func() {}}
	// No resync: every change arrives as an event, and a periodic resync
	// would only re-deliver what the sync already has.
	s.gwFactory = gwinformers.NewSharedInformerFactory(gw, 0)
	s.kubeFactory = informers.NewSharedInformerFactory(kube, 0)
	v1 := s.gwFactory.Gateway().V1()
	s.classes, s.gateways = v1.GatewayClasses().Lister(), v1.Gateways().Lister()
	s.tcpRoutes, s.udpRoutes = v1.TCPRoutes().Lister(), v1.UDPRoutes().Lister()
	s.httpRoutes = v1.HTTPRoutes().Lister()
	s.grants = v1.ReferenceGrants().Lister()
	s.namespaces = s.kubeFactory.Core().V1().Namespaces().Lister()
	return s
}

// Start registers the handlers, starts the informers and waits until they
// hold the API server's state. onChange (the sync runner's trigger) is
// called for each change that can alter routes or status; changes to the
// status we write ourselves are not such changes, except the addresses a
// Gateway holds (they keep pool assignments stable).
func (s *Source) Start(ctx context.Context, onChange func()) error {
	v1 := s.gwFactory.Gateway().V1()
	infs := []cache.SharedIndexInformer{
		v1.GatewayClasses().Informer(), v1.Gateways().Informer(), v1.TCPRoutes().Informer(),
		v1.UDPRoutes().Informer(), v1.HTTPRoutes().Informer(), v1.ReferenceGrants().Informer(), s.kubeFactory.Core().V1().Namespaces().Informer(),
	}
	if s.ServeHTTP {
		// Only TLS Secrets: the others can never be a certificate.
		f := informers.NewSharedInformerFactoryWithOptions(s.kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "type=" + string(corev1.SecretTypeTLS)
		}))
		s.secrets = f.Core().V1().Secrets().Lister()
		infs = append(infs, f.Core().V1().Secrets().Informer())
		s.secretFactory = f
		// EndpointSlices, for HTTPRoute backends that are headless
		// Services (nginx proxies to their endpoints; a VIP has none).
		s.slices = s.kubeFactory.Discovery().V1().EndpointSlices().Lister()
		infs = append(infs, s.kubeFactory.Discovery().V1().EndpointSlices().Informer())
	}
	for _, inf := range infs {
		if _, err := inf.AddEventHandler(handler(onChange)); err != nil {
			return err
		}
		s.synced = append(s.synced, inf.HasSynced)
	}
	s.gwFactory.Start(ctx.Done())
	s.kubeFactory.Start(ctx.Done())
	if s.secretFactory != nil {
		s.secretFactory.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), s.synced...) {
		return fmt.Errorf("listing Gateway API objects (are the CRDs installed?): %w", context.Cause(ctx))
	}
	return nil
}

// handler triggers onChange for adds, deletes and the updates that matter.
func handler(onChange func()) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { onChange() },
		DeleteFunc: func(any) { onChange() },
		UpdateFunc: func(old, cur any) {
			if relevantUpdate(old, cur) {
				onChange()
			}
		},
	}
}

// relevantUpdate is false for updates that only touched what we write
// (status) or bookkeeping (resourceVersion, managedFields).
func relevantUpdate(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 {
		return true
	}
	if o.GetGeneration() != c.GetGeneration() || !labels.Equals(o.GetLabels(), c.GetLabels()) {
		return true
	}
	switch oc := old.(type) {
	case *gwv1.Gateway:
		return !slices.Equal(addrValues(oc.Status.Addresses), addrValues(cur.(*gwv1.Gateway).Status.Addresses))
	case *gwv1.ReferenceGrant:
		return o.GetResourceVersion() != c.GetResourceVersion() // no generation on all servers
	case *corev1.Namespace:
		return false // only labels matter
	}
	return o.GetGeneration() == 0 && o.GetResourceVersion() != c.GetResourceVersion()
}

func addrValues(as []gwv1.GatewayStatusAddress) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Value)
	}
	return out
}

// Snapshot reads every object the translation needs from the informers.
func (s *Source) Snapshot(svcs []*corev1.Service) Input {
	in := Input{Services: svcs, Pool: s.pool, HTTP: s.ServeHTTP, HTTPPortBase: s.HTTPPortBase}
	if s.NodeAddrs != nil {
		in.NodeAddrs = s.NodeAddrs()
	}
	var err error
	if s.secrets != nil {
		if in.Secrets, err = s.secrets.List(labels.Everything()); err != nil {
			log.WithError(err).Warn("listing Secrets")
		}
	}
	if s.slices != nil {
		if in.Slices, err = s.slices.List(labels.Everything()); err != nil {
			log.WithError(err).Warn("listing EndpointSlices")
		}
	}
	if in.Classes, err = s.classes.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing GatewayClasses")
	}
	if in.Gateways, err = s.gateways.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing Gateways")
	}
	if in.TCPRoutes, err = s.tcpRoutes.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing TCPRoutes")
	}
	if in.UDPRoutes, err = s.udpRoutes.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing UDPRoutes")
	}
	if in.HTTPRoutes, err = s.httpRoutes.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing HTTPRoutes")
	}
	if in.Grants, err = s.grants.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing ReferenceGrants")
	}
	if in.Namespaces, err = s.namespaces.List(labels.Everything()); err != nil {
		log.WithError(err).Warn("listing Namespaces")
	}
	return in
}

// Routes translates the current snapshot (controller.RouteSource).
func (s *Source) Routes(svcs []*corev1.Service) controller.Routes {
	res := Translate(s.Snapshot(svcs))
	s.mu.Lock()
	s.pending = &res
	s.mu.Unlock()
	return res.Routes
}

// Programmed hands the status of the last translation to the writer once
// the sync that used it has applied (controller.ProgrammedNotifier), so
// Programmed is never written before this node's kernel has the routes.
func (s *Source) Programmed() {
	s.mu.Lock()
	if s.pending == nil {
		s.mu.Unlock()
		return
	}
	s.last, s.pending = s.pending, nil
	notify := s.onDone
	s.mu.Unlock()
	notify()
}

// HTTPRoutes translates the current snapshot and returns the HTTPRoutes
// attached to our HTTP listeners, for the nginx layer. It is a pure read:
// status stays with the L4 sync's translation (Routes), which sees the
// same objects.
func (s *Source) HTTPRoutes(svcs []*corev1.Service) []ingress.HTTPRoute {
	return Translate(s.Snapshot(svcs)).HTTP
}

// latest returns the Result of the last Routes call, or nil.
func (s *Source) latest() *Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// setNotify sets what Routes calls after each translation.
func (s *Source) setNotify(f func()) {
	s.mu.Lock()
	s.onDone = f
	s.mu.Unlock()
}

// ParsePool parses --gateway-address-pool ("" for none).
func ParsePool(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("--gateway-address-pool %q: %w", s, err)
	}
	return p.Masked(), nil
}

// List reads the Gateway API objects once (for verify); with http (the
// agents serve HTTP listeners), the TLS Secrets too.
func List(ctx context.Context, gw versioned.Interface, kube kubernetes.Interface, svcs []*corev1.Service, pool netip.Prefix, http bool) (Input, error) {
	in := Input{Services: svcs, Pool: pool, HTTP: http}
	if http {
		sl, err := kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{FieldSelector: "type=" + string(corev1.SecretTypeTLS)})
		if err != nil {
			return in, fmt.Errorf("list Secrets: %w", err)
		}
		for i := range sl.Items {
			in.Secrets = append(in.Secrets, &sl.Items[i])
		}
	}
	v1 := gw.GatewayV1()
	cl, err := v1.GatewayClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list GatewayClasses: %w", err)
	}
	for i := range cl.Items {
		in.Classes = append(in.Classes, &cl.Items[i])
	}
	gl, err := v1.Gateways("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list Gateways: %w", err)
	}
	for i := range gl.Items {
		in.Gateways = append(in.Gateways, &gl.Items[i])
	}
	tl, err := v1.TCPRoutes("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list TCPRoutes: %w", err)
	}
	for i := range tl.Items {
		in.TCPRoutes = append(in.TCPRoutes, &tl.Items[i])
	}
	ul, err := v1.UDPRoutes("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list UDPRoutes: %w", err)
	}
	for i := range ul.Items {
		in.UDPRoutes = append(in.UDPRoutes, &ul.Items[i])
	}
	hl, err := v1.HTTPRoutes("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list HTTPRoutes: %w", err)
	}
	for i := range hl.Items {
		in.HTTPRoutes = append(in.HTTPRoutes, &hl.Items[i])
	}
	rl, err := v1.ReferenceGrants("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list ReferenceGrants: %w", err)
	}
	for i := range rl.Items {
		in.Grants = append(in.Grants, &rl.Items[i])
	}
	nl, err := kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("list Namespaces: %w", err)
	}
	for i := range nl.Items {
		in.Namespaces = append(in.Namespaces, &nl.Items[i])
	}
	return in, nil
}

var everything = labels.Everything()
