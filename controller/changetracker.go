package controller

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
)

// ChangeTracker records which Services changed since the last sync. Every
// informer event goes through it: it keeps {previous, current} per object
// (the state at the last sync and now) and forgets an object whose changes
// cancel out (an update that touched only status or resourceVersion, an add
// followed by a delete), so those never cause a sync.
//
// Changes are grouped by Service: an EndpointSlice change counts for the
// Service named by its kubernetes.io/service-name label.
type ChangeTracker struct {
	mu      sync.Mutex
	changes map[objectKey]*change
	total   int
}

type objectKey struct {
	kind string // "Service" or "EndpointSlice"
	name types.NamespacedName
}

type change struct {
	service           types.NamespacedName
	previous, current any // nil: absent
}

// NewChangeTracker returns an empty tracker.
func NewChangeTracker() *ChangeTracker {
	return &ChangeTracker{changes: map[objectKey]*change{}}
}

// ServiceChanged records an informer event for a Service (nil = absent) and
// reports whether a real change is now pending for it.
func (t *ChangeTracker) ServiceChanged(previous, current *corev1.Service) bool {
	obj := current
	if obj == nil {
		obj = previous
	}
	if obj == nil {
		return false
	}
	name := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	return t.record(objectKey{KindService, name}, name, nilIfNil(previous), nilIfNil(current))
}

// SliceChanged records an informer event for an EndpointSlice (nil =
// absent) and reports whether a real change is now pending for it.
func (t *ChangeTracker) SliceChanged(previous, current *discoveryv1.EndpointSlice) bool {
	obj := current
	if obj == nil {
		obj = previous
	}
	if obj == nil {
		return false
	}
	svc := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Labels[discoveryv1.LabelServiceName]}
	return t.record(objectKey{KindEndpointSlice, types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}}, svc, nilIfNil(previous), nilIfNil(current))
}

func nilIfNil[T any](p *T) any {
	if p == nil {
		return nil
	}
	return p
}

func (t *ChangeTracker) record(k objectKey, svc types.NamespacedName, previous, current any) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.changes[k]
	if !ok {
		c = &change{service: svc, previous: previous}
		t.changes[k] = c
	}
	c.current = current
	t.total++
	if sameObject(c.previous, c.current) {
		delete(t.changes, k)
		return false
	}
	return true
}

// sameObject compares what steelyard reads of an object: metadata labels
// and annotations, the Service spec, the slice's endpoints and ports.
func sameObject(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case *corev1.Service:
		y, ok := b.(*corev1.Service)
		return ok && apiequality.Semantic.DeepEqual(x.Labels, y.Labels) &&
			apiequality.Semantic.DeepEqual(x.Annotations, y.Annotations) &&
			apiequality.Semantic.DeepEqual(x.Spec, y.Spec) &&
			apiequality.Semantic.DeepEqual(x.Status.LoadBalancer, y.Status.LoadBalancer)
	case *discoveryv1.EndpointSlice:
		y, ok := b.(*discoveryv1.EndpointSlice)
		return ok && apiequality.Semantic.DeepEqual(x.Labels, y.Labels) &&
			apiequality.Semantic.DeepEqual(x.Annotations, y.Annotations) &&
			x.AddressType == y.AddressType &&
			apiequality.Semantic.DeepEqual(x.Endpoints, y.Endpoints) &&
			apiequality.Semantic.DeepEqual(x.Ports, y.Ports)
	}
	return false
}

// Pending returns how many objects have a real change waiting for a sync.
func (t *ChangeTracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.changes)
}

// Total returns how many informer events the tracker has seen.
func (t *ChangeTracker) Total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// Drain returns the Services with pending changes and starts a new round:
// what is current now becomes the previous state of the next one.
func (t *ChangeTracker) Drain() map[types.NamespacedName]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[types.NamespacedName]bool, len(t.changes))
	for _, c := range t.changes {
		out[c.service] = true
	}
	t.changes = map[objectKey]*change{}
	return out
}
