package ingress

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller/runner"
)

var clog = logrus.WithField("subsys", "ingress")

// ControllerName is the spec.controller of the IngressClasses steelyard
// serves.
const ControllerName = "steelyard.io/ingress-nginx"

// annotationIngressClass is the class annotation of Ingresses older than
// spec.ingressClassName (still honoured by other controllers).
const annotationIngressClass = "kubernetes.io/ingress.class"

// Config configures a Controller.
type Config struct {
	// Class limits the controller to the IngressClass of that name (which
	// must name ControllerName); empty: every class that names it.
	Class string
	// ConfigMap is "namespace/name" of the nginx settings; empty: defaults.
	ConfigMap string
	// Render holds the upstream mode, ports and nginx directory.
	Render Options
	// MinSyncPeriod merges bursts of changes into one render.
	MinSyncPeriod time.Duration
	// HTTPRoutes, when set, returns the Gateway API HTTPRoutes attached to
	// our HTTP listeners (gateway.Source.HTTPRoutes); they are rendered
	// into the same nginx.conf as the Ingresses. Call Trigger when they
	// change.
	HTTPRoutes func(svcs []*corev1.Service) []HTTPRoute
}

// Controller watches Ingresses, IngressClasses, Services, TLS Secrets, the
// settings ConfigMap and (pods mode only) EndpointSlices, and keeps nginx's
// config in step with them.
type Controller struct {
	cfg      Config
	nginx    *Nginx
	recorder record.EventRecorder

	factories []informers.SharedInformerFactory
	ingresses cache.SharedIndexInformer
	classes   cache.SharedIndexInformer
	services  cache.SharedIndexInformer
	secrets   cache.SharedIndexInformer
	configMap cache.SharedIndexInformer
	slices    cache.SharedIndexInformer // nil in VIP mode

	runner   *runner.Runner
	reported map[string]bool
	problems prometheus.Gauge
}

// New returns a controller over client; recorder may be nil (no Events).
func New(client kubernetes.Interface, cfg Config, nginx *Nginx, recorder record.EventRecorder, reg prometheus.Registerer) (*Controller, error) {
	if cfg.Render.Upstreams == "" {
		cfg.Render.Upstreams = UpstreamsVIP
	}
	if cfg.Render.Upstreams != UpstreamsVIP && cfg.Render.Upstreams != UpstreamsPods {
		return nil, fmt.Errorf("upstreams %q: want %s or %s", cfg.Render.Upstreams, UpstreamsVIP, UpstreamsPods)
	}
	cfg.Render.Dir = nginx.Dir
	c := &Controller{cfg: cfg, nginx: nginx, recorder: recorder, reported: map[string]bool{}}
	c.problems = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "steelyard", Subsystem: "ingress",
		Name: "invalid_objects", Help: "Ingress problems (skipped Ingresses, missing backends or Secrets, conflicts) and bad ConfigMap keys in the running config."})
	if reg != nil {
		reg.MustRegister(c.problems)
	}
	all := informers.NewSharedInformerFactory(client, 0)
	c.ingresses = all.Networking().V1().Ingresses().Informer()
	c.classes = all.Networking().V1().IngressClasses().Informer()
	c.services = all.Core().V1().Services().Informer()
	if cfg.Render.Upstreams == UpstreamsPods {
		c.slices = all.Discovery().V1().EndpointSlices().Informer()
	}
	// Only TLS Secrets: nothing else is ever read, so nothing else is kept
	// in memory.
	secrets := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)).String()
	}))
	c.secrets = secrets.Core().V1().Secrets().Informer()
	c.factories = []informers.SharedInformerFactory{all, secrets}
	if cfg.ConfigMap != "" {
		ns, name, ok := strings.Cut(cfg.ConfigMap, "/")
		if !ok || ns == "" || name == "" {
			return nil, fmt.Errorf("--ingress-configmap %q: want namespace/name", cfg.ConfigMap)
		}
		cms := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns), informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
		c.configMap = cms.Core().V1().ConfigMaps().Informer()
		c.factories = append(c.factories, cms)
	}
	return c, nil
}

// Start starts the informers, waits for their caches, and starts the sync
// loop and nginx in the background (nginx starts with the first config).
func (c *Controller) Start(ctx context.Context) error {
	c.runner = runner.New(c.Sync, c.cfg.MinSyncPeriod, 0, 0, nil)
	if err := c.startInformers(ctx, c.runner.Trigger); err != nil {
		return err
	}
	go c.nginx.Run(ctx)
	go c.runner.Run(ctx.Done())
	return nil
}

// Trigger asks for a render soon (bursts merge); for changes the
// controller's own informers do not see, such as HTTPRoutes.
func (c *Controller) Trigger() {
	if c.runner != nil {
		c.runner.Trigger()
	}
}

// startInformers registers changed as the handler of every informer,
// starts them and waits for their caches.
func (c *Controller) startInformers(ctx context.Context, changed func()) error {
	poke := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		UpdateFunc: func(any, any) { changed() },
		DeleteFunc: func(any) { changed() },
	}
	for _, inf := range []cache.SharedIndexInformer{c.ingresses, c.classes, c.services, c.secrets, c.configMap, c.slices} {
		if inf == nil {
			continue
		}
		if _, err := inf.AddEventHandler(poke); err != nil {
			return err
		}
	}
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	for _, f := range c.factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("informer cache for %v did not sync", typ)
			}
		}
	}
	return nil
}

// Sync renders the current state and applies it to nginx.
func (c *Controller) Sync() error {
	start := time.Now()
	in := Input{Services: map[string]*corev1.Service{}, Secrets: map[string]*corev1.Secret{}}
	var classes []*networkingv1.IngressClass
	for _, o := range c.classes.GetStore().List() {
		if cl, ok := o.(*networkingv1.IngressClass); ok {
			classes = append(classes, cl)
		}
	}
	objects := map[string]runtime.Object{}
	for _, o := range c.ingresses.GetStore().List() {
		if ing, ok := o.(*networkingv1.Ingress); ok && Selected(ing, classes, c.cfg.Class) {
			in.Ingresses = append(in.Ingresses, ing)
			objects["Ingress/"+ing.Namespace+"/"+ing.Name] = ing
		}
	}
	var svcs []*corev1.Service
	for _, o := range c.services.GetStore().List() {
		if s, ok := o.(*corev1.Service); ok {
			in.Services[s.Namespace+"/"+s.Name] = s
			svcs = append(svcs, s)
		}
	}
	if c.cfg.HTTPRoutes != nil {
		in.HTTPRoutes = c.cfg.HTTPRoutes(svcs)
		for _, hr := range in.HTTPRoutes {
			objects["HTTPRoute/"+hr.Route.Namespace+"/"+hr.Route.Name] = hr.Route
		}
	}
	for _, o := range c.secrets.GetStore().List() {
		if s, ok := o.(*corev1.Secret); ok && s.Type == corev1.SecretTypeTLS {
			in.Secrets[s.Namespace+"/"+s.Name] = s
		}
	}
	if c.slices != nil {
		for _, o := range c.slices.GetStore().List() {
			if s, ok := o.(*discoveryv1.EndpointSlice); ok {
				in.Slices = append(in.Slices, s)
			}
		}
	}
	in.Settings = DefaultSettings()
	var cmProblems []Problem
	if c.configMap != nil {
		for _, o := range c.configMap.GetStore().List() {
			cm, ok := o.(*corev1.ConfigMap)
			if !ok || cm.Namespace+"/"+cm.Name != c.cfg.ConfigMap {
				continue
			}
			var errs []error
			in.Settings, errs = ParseSettings(cm.Data)
			objects["ConfigMap/"+cm.Namespace+"/"+cm.Name] = cm
			for _, err := range errs {
				cmProblems = append(cmProblems, Problem{Kind: "ConfigMap", Namespace: cm.Namespace, Name: cm.Name, Reason: ReasonInvalidConfig, Message: err.Error()})
			}
		}
	}
	out := Render(in, c.cfg.Render)
	out.Problems = append(cmProblems, out.Problems...)
	c.report(out.Problems, objects)
	reloaded, err := c.nginx.Apply(out)
	fields := logrus.Fields{"ingresses": len(in.Ingresses), "httproutes": len(in.HTTPRoutes), "problems": len(out.Problems), "reloaded": reloaded,
		"hash": out.Hash()[:12], "elapsed": time.Since(start).Round(time.Microsecond)}
	if err != nil {
		clog.WithFields(fields).WithError(err).Error("nginx config not applied")
		return err
	}
	clog.WithFields(fields).Debug("ingress synced")
	return nil
}

// report logs and records (as Warning Events) the problems that are new
// since the last sync, and logs the ones that went away.
func (c *Controller) report(problems []Problem, objects map[string]runtime.Object) {
	now := map[string]bool{}
	for _, p := range problems {
		key := p.String()
		now[key] = true
		if c.reported[key] {
			continue
		}
		clog.WithFields(logrus.Fields{"object": p.Kind + "/" + p.Namespace + "/" + p.Name, "reason": p.Reason}).Warn(p.Message)
		if c.recorder != nil {
			if hr, ok := objects[p.Kind+"/"+p.Namespace+"/"+p.Name].(*gwv1.HTTPRoute); ok {
				// Not in client-go's scheme: refer to it by hand.
				c.recorder.Event(&corev1.ObjectReference{APIVersion: gwv1.GroupVersion.String(), Kind: p.Kind, Namespace: p.Namespace, Name: p.Name, UID: hr.UID},
					corev1.EventTypeWarning, p.Reason, p.Message)
			} else if obj := objects[p.Kind+"/"+p.Namespace+"/"+p.Name]; obj != nil {
				c.recorder.Event(obj, corev1.EventTypeWarning, p.Reason, p.Message)
			} else {
				// An object that failed validation before it was listed
				// (should not happen) still gets its Event by reference.
				c.recorder.Event(&corev1.ObjectReference{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}, corev1.EventTypeWarning, p.Reason, p.Message)
			}
		}
	}
	var gone []string
	for key := range c.reported {
		if !now[key] {
			gone = append(gone, key)
		}
	}
	sort.Strings(gone)
	for _, key := range gone {
		clog.WithField("problem", key).Info("resolved")
	}
	c.reported = now
	c.problems.Set(float64(len(problems)))
}

// Selected reports whether ing belongs to us: its spec.ingressClassName
// (or, for old Ingresses, its kubernetes.io/ingress.class annotation) names
// an IngressClass whose controller is ControllerName, or it names no class
// and such an IngressClass is the cluster's default. only, when set, limits
// us to the class of that name.
func Selected(ing *networkingv1.Ingress, classes []*networkingv1.IngressClass, only string) bool {
	ours := map[string]bool{}
	isDefault := false
	for _, cl := range classes {
		if cl.Spec.Controller != ControllerName || (only != "" && cl.Name != only) {
			continue
		}
		ours[cl.Name] = true
		if cl.Annotations[networkingv1.AnnotationIsDefaultIngressClass] == "true" {
			isDefault = true
		}
	}
	if ing.Spec.IngressClassName != nil {
		return ours[*ing.Spec.IngressClassName]
	}
	if a, ok := ing.Annotations[annotationIngressClass]; ok {
		return ours[a]
	}
	return isDefault
}
