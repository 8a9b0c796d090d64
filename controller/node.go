package controller

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Field keys of the node facts log line.
const (
	fieldZone      = "zone"
	fieldAddresses = "addresses"
	fieldPodCIDRs  = "pod-cidrs"
)

// NodeFacts are what the agent uses from its own Node object.
type NodeFacts struct {
	// Zone is the topology.kubernetes.io/zone label.
	Zone string
	// Addrs are the primary addresses: the first InternalIP of each family,
	// else the first ExternalIP.
	Addrs []netip.Addr
	// PodCIDRs are spec.podCIDRs (node IPAM's ranges of this node), for
	// --detect-local-mode=NodeCIDR; values that do not parse are left out.
	PodCIDRs []netip.Prefix
}

// Equal reports whether f and o carry the same zone, addresses and pod
// ranges.
func (f NodeFacts) Equal(o NodeFacts) bool {
	return f.Zone == o.Zone && slices.Equal(f.Addrs, o.Addrs) && slices.Equal(f.PodCIDRs, o.PodCIDRs)
}

// PodCIDRs returns a Node's pod ranges, masked: spec.podCIDRs, or
// spec.podCIDR where only that is set.
func PodCIDRs(node *corev1.Node) ([]netip.Prefix, error) {
	vals := node.Spec.PodCIDRs
	if len(vals) == 0 && node.Spec.PodCIDR != "" {
		vals = []string{node.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("Node %s: pod CIDR %q: %w", node.Name, v, err)
		}
		if p = p.Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// nodeFacts reads the facts off a Node.
func nodeFacts(node *corev1.Node) NodeFacts {
	f := NodeFacts{Zone: node.Labels[corev1.LabelTopologyZone]}
	f.PodCIDRs, _ = PodCIDRs(node) // an unparsable range: none (the agent logs its own check at start)
	for _, typ := range []corev1.NodeAddressType{corev1.NodeInternalIP, corev1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if a.Type != typ || err != nil {
				continue
			}
			if !slices.ContainsFunc(f.Addrs, func(x netip.Addr) bool { return x.Is4() == ip.Is4() }) {
				f.Addrs = append(f.Addrs, ip)
			}
		}
	}
	return f
}

// NodeWatcher follows this node's Node object, by name: a list and watch
// with the field selector metadata.name=<name>, so the API server sends
// this one Node and nothing about the others. RBAC cannot limit list and
// watch to one object by field selector, so the ClusterRole grants get,
// list and watch on nodes, as kube-proxy's does; the selector keeps the
// traffic and the cache to one object.
type NodeWatcher struct {
	name     string
	onChange func(NodeFacts)

	mu    sync.Mutex
	facts NodeFacts
	known bool
}

// WatchNode starts a NodeWatcher for the Node called name until ctx ends;
// onChange (may be nil) runs, on the watcher's goroutine, each time the
// zone, the primary addresses or the pod ranges change, the first sighting included.
func WatchNode(ctx context.Context, client kubernetes.Interface, name string, onChange func(NodeFacts)) *NodeWatcher {
	w := &NodeWatcher{name: name, onChange: onChange}
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return client.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return client.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		// Tells the reflector whether the client can stream the initial
		// list (WatchList); the fake clientset cannot.
		ListerWatcher: cache.ToListWatcherWithWatchListSemantics(lw, client),
		ObjectType:    &corev1.Node{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.observe(obj) },
			UpdateFunc: func(_, obj any) { w.observe(obj) },
			// A deleted Node keeps its last facts: kubelet registers it
			// again, and the rules need not change meanwhile.
		},
	})
	go ctrl.RunWithContext(ctx)
	return w
}

func (w *NodeWatcher) observe(obj any) {
	node, ok := obj.(*corev1.Node)
	// The selector already filters by name; a server (or fake) that
	// ignored it must not make us adopt another node's facts.
	if !ok || node.Name != w.name {
		return
	}
	f := nodeFacts(node)
	w.mu.Lock()
	changed := !w.known || !w.facts.Equal(f)
	w.facts, w.known = f, true
	w.mu.Unlock()
	if changed {
		log.WithField(fieldZone, f.Zone).WithField(fieldAddresses, f.Addrs).WithField(fieldPodCIDRs, f.PodCIDRs).Info("this node's zone, addresses and pod ranges")
		if w.onChange != nil {
			w.onChange(f)
		}
	}
}

// Facts returns the latest facts and whether the Node has been seen.
func (w *NodeWatcher) Facts() (NodeFacts, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return NodeFacts{Zone: w.facts.Zone, Addrs: slices.Clone(w.facts.Addrs), PodCIDRs: slices.Clone(w.facts.PodCIDRs)}, w.known
}
