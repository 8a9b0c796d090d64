package controller

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// LabelServiceProxyName is the label that hands a Service to a proxy other
// than the cluster's default one (kube-proxy skips labelled Services).
const LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"

// labelHeadless marks the EndpointSlices of headless Services; no proxy
// needs them.
const labelHeadless = "service.kubernetes.io/headless"

// ClusterOptions choose which Services a ClusterSource sees.
type ClusterOptions struct {
	// ServiceProxyName, when set, selects only Services (and slices)
	// labelled service.kubernetes.io/service-proxy-name=<it>, so steelyard
	// runs beside kube-proxy; when empty, every Service without that label
	// (steelyard replaces kube-proxy).
	ServiceProxyName string
	// ResyncPeriod is the informers' resync period (0: none).
	ResyncPeriod time.Duration
}

// ClusterSource watches Services and EndpointSlices of the API server with
// shared informers. Events go through a ChangeTracker; only real changes
// call the onChange hook (which pokes the sync runner).
type ClusterSource struct {
	factory  informers.SharedInformerFactory
	services corelisters.ServiceLister
	slices   discoverylisters.EndpointSliceLister
	Tracker  *ChangeTracker
	selector labels.Selector
}

// NewClusterSource returns a source over client; Start begins the watch.
func NewClusterSource(client kubernetes.Interface, opts ClusterOptions) (*ClusterSource, error) {
	sel, err := proxySelector(opts.ServiceProxyName)
	if err != nil {
		return nil, err
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, opts.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }))
	return &ClusterSource{
		factory:  f,
		services: f.Core().V1().Services().Lister(),
		slices:   f.Discovery().V1().EndpointSlices().Lister(),
		Tracker:  NewChangeTracker(),
		selector: sel,
	}, nil
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

// Start registers the event handlers, starts the informers and waits until
// their caches hold the API server's state, so the first sync sees
// everything. onChange is called after each real change.
func (c *ClusterSource) Start(ctx context.Context, onChange func()) error {
	svcHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*corev1.Service); ok && c.Tracker.ServiceChanged(nil, s) {
				onChange()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Service)
			n, ok2 := newObj.(*corev1.Service)
			if ok1 && ok2 && c.Tracker.ServiceChanged(o, n) {
				onChange()
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*corev1.Service); ok && c.Tracker.ServiceChanged(s, nil) {
				onChange()
			}
		},
	}
	sliceHandler := cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && c.Tracker.SliceChanged(nil, s) {
				onChange()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*discoveryv1.EndpointSlice)
			n, ok2 := newObj.(*discoveryv1.EndpointSlice)
			if ok1 && ok2 && c.Tracker.SliceChanged(o, n) {
				onChange()
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && c.Tracker.SliceChanged(s, nil) {
				onChange()
			}
		},
	}
	if _, err := c.factory.Core().V1().Services().Informer().AddEventHandler(svcHandler); err != nil {
		return err
	}
	if _, err := c.factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(sliceHandler); err != nil {
		return err
	}
	c.factory.Start(ctx.Done())
	for typ, ok := range c.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer cache for %v did not sync", typ)
		}
	}
	return nil
}

// Load returns every Service and EndpointSlice the informers hold. The
// objects are the informers' own: callers must not modify them.
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
// with one get: the agent needs nothing else from the Node, so RBAC grants
// only get on nodes, not list or watch. A zone change needs an agent
// restart, as with kube-proxy's topology (which reads it at start too).
func NodeInfo(ctx context.Context, client kubernetes.Interface, name string) (zone string, addrs []netip.Addr, err error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, fmt.Errorf("get Node %q: %w", name, err)
	}
	zone = node.Labels[corev1.LabelTopologyZone]
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if a.Type != typ || err != nil {
				continue
			}
			if !slices.ContainsFunc(addrs, func(x netip.Addr) bool { return x.Is4() == ip.Is4() }) {
				addrs = append(addrs, ip)
			}
		}
	}
	return zone, addrs, nil
}
