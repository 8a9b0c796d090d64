package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// LabelServiceProxyName is the label that hands a Service to a proxy other
// than the cluster's default one (kube-proxy skips labelled Services).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// labelHeadless marks the EndpointSlices of headless Services; no proxy
// needs them.
const labelHeadless = "service.kubernetes.io/headless"

// Field keys of the API server reachability log lines.
const (
	fieldResource = "resource"
	fieldDownFor  = "down_for"
)

// WatchBackoff is how long each reflector waits between failed list or
// watch requests, and between a watch that ended and the next relist:
// 0.2 s doubling to a 2 s cap, each wait stretched by a random factor of 1
// to 1.5. client-go's default (0.8 s doubling to 30 s, factor 1 to 2,
// which kube-proxy keeps) left a node 31 to 71 s behind after a 30 s API
// server outage. With this one the watch is back within 3 s of the API
// server; a restarted API server then refuses the old resourceVersion as
// too old, and the relist follows one more wait: 2.5 to 5.2 s in all
// over ten measured outages (about 6.5 s at worst). The cost is one refused connection per resource every 2-3 s
// per node while the API server is down; the jitter spreads the nodes'
// reconnections. (client-go resets the backoff only two minutes after its
// last reset, so waits stay near the cap for a while after an outage.)
var WatchBackoff = wait.Backoff{
	Duration: 200 * time.Millisecond,
	Factor:   2,
	Jitter:   0.5,
	Steps:    10, // more than the doublings to the cap
	Cap:      2 * time.Second,
}

// ClusterOptions choose which Services a ClusterSource sees.
type ClusterOptions struct {
	// ServiceProxyName, when set, selects only Services (and slices)
	// labelled service.kubernetes.io/service-proxy-name=<it>, so steelyard
	// runs beside kube-proxy; when empty, every Service without that label
	// (steelyard replaces kube-proxy).
	ServiceProxyName string
}

// ClusterSource watches Services and EndpointSlices of the API server, one
// client-go reflector each. Events go through a ChangeTracker; only real
// changes call the onChange hook (which pokes the sync runner).
//
// Why reflectors and not a SharedInformerFactory: the factory's informers
// cannot be given a retry backoff (client-go v0.37, kubernetes#136943), and
// theirs keeps a node behind for up to a minute after an API server
// outage. A reflector takes WatchBackoff and writes into a watchStore,
// which keeps the objects for the listers and hands each change, with the
// object's previous state, to the tracker: what the informers' handlers
// did, without their queue.
type ClusterSource struct {
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	Tracker  *ChangeTracker
	// API says whether the API server answers the watches; it logs each
	// outage once when it starts and once when it ends.
	API      *APIHealth
	selector labels.Selector

	svcStore, sliceStore *watchStore
	svcLW, sliceLW       cache.ListerWatcher
	// snapshot is held by both stores while they write an object and tell
	// the tracker, and by the agent while it drains the tracker and lists
	// the stores (Lock, Unlock), so what a sync builds is exactly what the
	// tracker compares the next events with.
	snapshot sync.Mutex
}

// Lock keeps the stores from changing until Unlock: the agent holds it from
// the tracker's Drain to the end of Load. Otherwise an event landing between
// the two is built by that sync while the tracker still compares with the
// object as it was at the Drain, and a later event that reverts it looks
// like no change at all: the kernel kept the middle state until the next
// change of that object or the next full sync
// (TestAgentChangeBetweenDrainAndLoadThenReverted).
func (c *ClusterSource) Lock() { c.snapshot.Lock() }

// Unlock lets the stores change again.
func (c *ClusterSource) Unlock() { c.snapshot.Unlock() }

var _ sync.Locker = (*ClusterSource)(nil)

// NewClusterSource returns a source over client; Start begins the watch.
func NewClusterSource(client kubernetes.Interface, opts ClusterOptions) (*ClusterSource, error) {
	sel, err := proxySelector(opts.ServiceProxyName)
	if err != nil {
		return nil, err
	}
	c := &ClusterSource{
		Tracker:    NewChangeTracker(),
		API:        NewAPIHealth(nil),
		selector:   sel,
		svcStore:   newWatchStore(),
		sliceStore: newWatchStore(),
	}
	c.svcStore.mu, c.sliceStore.mu = &c.snapshot, &c.snapshot
	c.services = corelisters.NewServiceLister(c.svcStore.Indexer)
	c.slices = discoverylisters.NewEndpointSliceLister(c.sliceStore.Indexer)
	svcs := client.CoreV1().Services(metav1.NamespaceAll)
	eps := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll)
	c.svcLW = c.listWatch(client, "services",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return svcs.List(ctx, o) },
		svcs.Watch)
	c.sliceLW = c.listWatch(client, "endpointslices",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return eps.List(ctx, o) },
		eps.Watch)
	return c, nil
}

// listWatch lists and watches one resource with kube-proxy's label
// selection, and reports every request's outcome to c.API.
func (c *ClusterSource) listWatch(client kubernetes.Interface, resource string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = c.selector.String()
			obj, err := list(ctx, o)
			c.API.observe(ctx, resource, err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = c.selector.String()
			w, err := watchFn(ctx, o)
			c.API.observe(ctx, resource, err)
			return w, err
		},
	}
	// As the generated informers do: the reflector uses streaming lists
	// (WatchList) only with a client that supports them.
	return cache.ToListWatcherWithWatchListSemantics(lw, client)
}

// proxySelector is kube-proxy's selection: no headless slices, and the
// service-proxy-name label absent (or equal to ours).
func proxySelector(proxyName string) (labels.Selector, error) {
	noHeadless, err := labels.NewRequirement(labelHeadless, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	var byName *labels.Requirement
	if proxyName == "" {
		byName, err = labels.NewRequirement(LabelServiceProxyName, selection.DoesNotExist, nil)
	} else {
		byName, err = labels.NewRequirement(LabelServiceProxyName, selection.Equals, []string{proxyName})
	}
	if err != nil {
		return nil, fmt.Errorf("--service-proxy-name %q: %w", proxyName, err)
	}
	return labels.NewSelector().Add(*noHeadless, *byName), nil
}

// Start runs the reflectors and waits until both stores hold the API
// server's state, so the first sync sees everything. onChange is called
// after each real change.
func (c *ClusterSource) Start(ctx context.Context, onChange func()) error {
	c.svcStore.changed = trackWith(c.Tracker.ServiceChanged, onChange)
	c.sliceStore.changed = trackWith(c.Tracker.SliceChanged, onChange)
	// client-go logs an error for each failed relist; during an outage
	// that is one line per resource every 2-3 s, all saying what the one
	// warning of c.API said. They go to debug level instead.
	rctx := ctx
	if logger := klog.FromContext(ctx); logger.GetSink() != nil {
		// WithSink, not klog.New: New would Init the shared sink again.
		rctx = klog.NewContext(ctx, logger.WithSink(outageSink{LogSink: logger.GetSink(), api: c.API}))
	}
	for _, r := range []struct {
		name  string
		lw    cache.ListerWatcher
		typ   runtime.Object
		store *watchStore
	}{
		{"services", c.svcLW, &corev1.Service{}, c.svcStore},
		{"endpointslices", c.sliceLW, &discoveryv1.EndpointSlice{}, c.sliceStore},
	} {
		backoff := WatchBackoff
		go cache.NewReflectorWithOptions(r.lw, r.typ, r.store, cache.ReflectorOptions{
			Name:    "steelyard/" + r.name,
			Backoff: &backoff,
		}).RunWithContext(rctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.svcStore.HasSynced, c.sliceStore.HasSynced) {
		return fmt.Errorf("listing Services and EndpointSlices: %w", context.Cause(ctx))
	}
	return nil
}

// outageSink passes client-go's log lines on, except errors logged while
// the API server is unreachable (already reported by APIHealth), which it
// logs at verbosity 4 (logrus debug or trace).
type outageSink struct {
	klog.LogSink
	api *APIHealth
}

// Error logs at verbosity 4 while the API server is unreachable.
func (s outageSink) Error(err error, msg string, keysAndValues ...any) {
	if s.api.Reachable() {
		s.LogSink.Error(err, msg, keysAndValues...)
		return
	}
	if s.LogSink.Enabled(4) {
		s.LogSink.Info(4, msg, append(keysAndValues, "err", err)...)
	}
}

// WithValues keeps the filter on the derived sink.
func (s outageSink) WithValues(keysAndValues ...any) klog.LogSink {
	return outageSink{LogSink: s.LogSink.WithValues(keysAndValues...), api: s.api}
}

// WithName keeps the filter on the derived sink.
func (s outageSink) WithName(name string) klog.LogSink {
	return outageSink{LogSink: s.LogSink.WithName(name), api: s.api}
}

// trackWith adapts a tracker method to the store's untyped hook.
func trackWith[T any](track func(previous, current *T) bool, onChange func()) func(previous, current any) {
	return func(previous, current any) {
		p, _ := previous.(*T)
		c, _ := current.(*T)
		if (p != nil || c != nil) && track(p, c) {
			onChange()
		}
	}
}

// Load returns every Service and EndpointSlice the reflectors hold. The
// objects are the stores' own: callers must not modify them.
func (c *ClusterSource) Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error) {
	svcs, err := c.services.List(labels.Everything())
	if err != nil {
		return nil, nil, []error{err}
	}
	slices, err := c.slices.List(labels.Everything())
	if err != nil {
		return nil, nil, []error{err}
	}
	return svcs, slices, nil
}

// watchStore is what a reflector writes into: an indexer for the listers,
// and a hook told each change with the object's previous state (nil when
// added) and its new one (nil when deleted). The indexer is updated before
// the hook runs, so a sync it triggers sees the change. One reflector
// calls it, from one goroutine.
type watchStore struct {
	cache.Indexer
	changed func(previous, current any)
	synced  atomic.Bool
	// mu, when set, is held across each write and its hook (see
	// ClusterSource.Lock).
	mu *sync.Mutex
}

func (s *watchStore) lock() func() {
	if s.mu == nil {
		return func() {}
	}
	s.mu.Lock()
	return s.mu.Unlock
}

var _ cache.ReflectorStore = (*watchStore)(nil)

func newWatchStore() *watchStore {
	return &watchStore{
		Indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		changed: func(any, any) {},
	}
}

// HasSynced reports whether the first list has been stored.
func (s *watchStore) HasSynced() bool { return s.synced.Load() }

// Add stores an added (or, after a relist, re-added) object.
func (s *watchStore) Add(obj any) error { return s.Update(obj) }

// Transformer implements cache.TransformingStore: the reflector's
// streaming list strips what we never read before it buffers the objects.
func (s *watchStore) Transformer() cache.TransformFunc { return stripUnread }

// StripUnread is the transform the watch stores apply to each object
// before they keep it (stripUnread), for benchmarks of a node's memory.
func StripUnread(obj any) (any, error) { return stripUnread(obj) }

// stripUnread drops the parts of an object the agent never reads before it
// is stored: managedFields (every object the API server writes has them)
// and kubectl's last-applied copy of the whole object. Kept, they are most
// of a stored Service's bytes at 10,000 Services. Idempotent; the object is
// the store's own (fresh from the decoder), so it is changed in place.
func stripUnread(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a != nil {
			if _, ok := a[corev1.LastAppliedConfigAnnotation]; ok {
				delete(a, corev1.LastAppliedConfigAnnotation)
				m.SetAnnotations(a)
			}
		}
	}
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		stripSlice(o)
	case *corev1.Service:
		stripService(o)
	}
	return obj, nil
}

// stripService drops what the agent never reads of a Service: its labels
// (the service-proxy-name selector is the API server's, ListOptions) and
// its selector (the EndpointSlice controller's business). Two maps of
// about 300 bytes each per Service: 6 MiB at 10,000 Services
// (BenchmarkMemoryFromAPI10kx10, whose Services have one label and a
// one-key selector). Without them a change of either is no change to the
// tracker (sameObject), which is right: the Build reads neither.
func stripService(svc *corev1.Service) {
	svc.Labels = nil
	svc.Spec.Selector = nil
}

// stripSlice drops what the Builder never reads of an EndpointSlice: its
// owner references, and of each endpoint the hostname, the deprecated
// topology and all of the target reference but the pod's name (Kind,
// Namespace, UID and ResourceVersion).
//
// The endpoints' conditions, node names and zones point to shared values:
// the decoder allocates one of each per endpoint, and a store's objects
// are read only. Measured with BenchmarkSliceStoreHeap10kx10 (10,000
// slices x 10 endpoints decoded from JSON): 53.9 MiB as sent, 48.0 MiB
// stripped, 42.8 MiB stripped and shared (-21 %).
func stripSlice(sl *discoveryv1.EndpointSlice) {
	sl.OwnerReferences = nil
	// The decoder appends endpoint by endpoint: 10 endpoints end in an
	// array of 16 (1,536 bytes for 960). A copy of the right size frees
	// 4.9 MiB of the stores at 10,000 slices x 10 (BenchmarkMemoryFromAPI10kx10).
	// The margin keeps a second strip (Update after the Transformer) from
	// copying again what the size classes round up.
	if eps := sl.Endpoints; cap(eps) > len(eps)+len(eps)/4+1 {
		sl.Endpoints = slices.Clone(eps)
	}
	for i := range sl.Endpoints {
		ep := &sl.Endpoints[i]
		ep.Hostname, ep.DeprecatedTopology = nil, nil
		if r := ep.TargetRef; r != nil {
			// In place: the reference is the decoder's, like the object.
			*r = corev1.ObjectReference{Name: r.Name}
		}
		c := &ep.Conditions
		c.Ready, c.Serving, c.Terminating = sharedBool(c.Ready), sharedBool(c.Serving), sharedBool(c.Terminating)
		ep.NodeName, ep.Zone = shared.ptr(ep.NodeName), shared.ptr(ep.Zone)
	}
}

var sharedTrue, sharedFalse = true, false

// sharedBool returns a shared pointer to *b's value (nil stays nil).
func sharedBool(b *bool) *bool {
	switch {
	case b == nil:
		return nil
	case *b:
		return &sharedTrue
	}
	return &sharedFalse
}

// stringPtrs hands out one shared pointer per string value (node names and
// zones: as many as the cluster has nodes and zones). Past maxShared
// values it stops sharing, so a cluster with odd values cannot grow it
// without bound.
type stringPtrs struct {
	mu sync.Mutex
	m  map[string]*string
}

const maxShared = 100000

var shared = &stringPtrs{m: map[string]*string{}}

func (s *stringPtrs) ptr(p *string) *string {
	if p == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if q, ok := s.m[*p]; ok {
		return q
	}
	if len(s.m) < maxShared {
		s.m[*p] = p
	}
	return p
}

// Update stores a changed object.
func (s *watchStore) Update(obj any) error {
	defer s.lock()()
	obj, _ = stripUnread(obj)
	previous, _, err := s.Indexer.Get(obj)
	if err != nil {
		return err
	}
	if err := s.Indexer.Update(obj); err != nil {
		return err
	}
	s.changed(previous, obj)
	return nil
}

// Delete removes an object; the hook gets the last state stored.
func (s *watchStore) Delete(obj any) error {
	defer s.lock()()
	previous, ok, err := s.Indexer.Get(obj)
	if err != nil {
		return err
	}
	if err := s.Indexer.Delete(obj); err != nil {
		return err
	}
	if !ok {
		previous = obj
	}
	s.changed(previous, nil)
	return nil
}

// Replace stores a full list (the first one, or a relist after the watch
// was lost) and reports what differs from the objects held: deletions
// missed while the watch was down arrive here.
func (s *watchStore) Replace(list []any, resourceVersion string) error {
	defer s.lock()()
	before := map[string]any{}
	for _, o := range s.Indexer.List() {
		if k, err := cache.MetaNamespaceKeyFunc(o); err == nil {
			before[k] = o
		}
	}
	after := make([]any, len(list))
	for i, o := range list {
		after[i], _ = stripUnread(o)
	}
	if err := s.Indexer.Replace(list, resourceVersion); err != nil {
		return err
	}
	for _, o := range after {
		k, err := cache.MetaNamespaceKeyFunc(o)
		if err != nil {
			continue
		}
		previous, ok := before[k]
		delete(before, k)
		if ok && sameVersion(previous, o) {
			continue
		}
		s.changed(previous, o)
	}
	for _, previous := range before {
		s.changed(previous, nil)
	}
	s.synced.Store(true)
	return nil
}

// Resync does nothing: re-delivering unchanged objects would only give the
// tracker no-ops to drop.
func (s *watchStore) Resync() error { return nil }

// sameVersion reports whether two states of an object carry the same
// resourceVersion (so nothing changed between them).
func sameVersion(a, b any) bool {
	ma, ok1 := a.(metav1.Object)
	mb, ok2 := b.(metav1.Object)
	return ok1 && ok2 && ma.GetResourceVersion() != "" && ma.GetResourceVersion() == mb.GetResourceVersion()
}

// APIHealth follows whether the API server answers the source's list and
// watch requests. An outage starts with the first failed request and ends
// when the latest request of every resource has succeeded, that is when
// changes flow again; each is logged once (a warning with the error, an
// info line with its length), whatever the number of retries in between.
type APIHealth struct {
	clock clock.Clock
	log   *logrus.Entry

	mu         sync.Mutex
	failing    map[string]bool // resource -> its latest request failed
	downSince  time.Time
	outages    int
	lastOutage time.Duration
}

// NewAPIHealth returns an APIHealth that reads time from clk (the real
// clock when nil).
func NewAPIHealth(clk clock.Clock) *APIHealth {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &APIHealth{clock: clk, log: log, failing: map[string]bool{}}
}

// observe records the outcome of one request for resource. Requests ended
// by ctx (the agent stopping) and the expired-resourceVersion answers of
// the watch protocol (the server answered) are not failures.
func (h *APIHealth) observe(ctx context.Context, resource string, err error) {
	if err != nil && (ctx.Err() != nil || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) || errors.Is(err, context.Canceled)) {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		wasDown := len(h.failing) > 0
		h.failing[resource] = true
		if wasDown {
			h.log.WithError(err).WithField(fieldResource, resource).Debug("API server still unreachable")
			return
		}
		h.downSince = h.clock.Now()
		h.log.WithError(err).WithField(fieldResource, resource).Warn("API server unreachable; the rules stay as they are")
		return
	}
	if !h.failing[resource] {
		return
	}
	delete(h.failing, resource)
	if len(h.failing) > 0 {
		return
	}
	h.outages++
	h.lastOutage = h.clock.Since(h.downSince)
	h.log.WithField(fieldDownFor, h.lastOutage.Round(time.Millisecond).String()).Info("API server reachable again")
}

// Reachable reports whether the latest request of every resource succeeded.
func (h *APIHealth) Reachable() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.failing) == 0
}

// Outages returns how many outages have ended and how long the last one
// lasted.
func (h *APIHealth) Outages() (count int, last time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.outages, h.lastOutage
}

// ListCluster reads every Service and EndpointSlice the agent would see,
// once (for verify). The selection is the ClusterSource's.
func ListCluster(ctx context.Context, client kubernetes.Interface, opts ClusterOptions) ([]*corev1.Service, []*discoveryv1.EndpointSlice, error) {
	sel, err := proxySelector(opts.ServiceProxyName)
	if err != nil {
		return nil, nil, err
	}
	lo := metav1.ListOptions{LabelSelector: sel.String()}
	svcList, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, lo)
	if err != nil {
		return nil, nil, fmt.Errorf("list Services: %w", err)
	}
	sliceList, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, lo)
	if err != nil {
		return nil, nil, fmt.Errorf("list EndpointSlices: %w", err)
	}
	svcs := make([]*corev1.Service, 0, len(svcList.Items))
	for i := range svcList.Items {
		svcs = append(svcs, &svcList.Items[i])
	}
	slices := make([]*discoveryv1.EndpointSlice, 0, len(sliceList.Items))
	for i := range sliceList.Items {
		slices = append(slices, &sliceList.Items[i])
	}
	return svcs, slices, nil
}

// NodeInfo reads this node's zone (the topology.kubernetes.io/zone label)
// and its primary addresses (InternalIP, else ExternalIP, one per family)
// with one get, at start; WatchNode then follows changes.
func NodeInfo(ctx context.Context, client kubernetes.Interface, name string) (zone string, addrs []netip.Addr, err error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("get Node %q: %w", name, err)
	}
	f := nodeFacts(node)
	return f.Zone, f.Addrs, nil
}
