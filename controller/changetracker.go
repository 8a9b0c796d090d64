package controller

import (
	"sync"
	"time"

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
	// settled are objects whose changes cancelled out since the last
	// Drain, with their state now. They cause no sync, but the next Drain
	// hands them over: a Builder that read the objects in between (a full
	// sync's list) holds the intermediate state and must see them again.
	settled map[objectKey]any
	total   map[string]int
}

type objectKey struct {
	kind string // "Service" or "EndpointSlice"
	name types.NamespacedName
}

type change struct {
	service           types.NamespacedName
	previous, current any // nil: absent
	// triggers are the EndpointSlice's last-change-trigger-times seen since
	// the last sync, for the network programming latency metric.
	triggers []time.Time
}

// NewChangeTracker returns an empty tracker.
func NewChangeTracker() *ChangeTracker {
	return &ChangeTracker{changes: map[objectKey]*change{}, settled: map[objectKey]any{}, total: map[string]int{}}
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
	return t.record(objectKey{KindService, name}, name, nilIfNil(previous), nilIfNil(current), time.Time{})
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
	var trigger time.Time
	if current != nil {
		trigger = triggerTime(previous, current)
	}
	return t.record(objectKey{KindEndpointSlice, types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}}, svc, nilIfNil(previous), nilIfNil(current), trigger)
}

// triggerTime returns the slice's last-change-trigger-time when this event
// set a new one (the EndpointSlice controller stamps the time of the pod or
// Service change it reacted to).
func triggerTime(previous, current *discoveryv1.EndpointSlice) time.Time {
	v := current.Annotations[corev1.EndpointsLastChangeTriggerTime]
	if v == "" || (previous != nil && previous.Annotations[corev1.EndpointsLastChangeTriggerTime] == v) {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

func nilIfNil[T any](p *T) any {
	if p == nil {
		return nil
	}
	return p
}

func (t *ChangeTracker) record(k objectKey, svc types.NamespacedName, previous, current any, trigger time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.changes[k]
	if !ok {
		c = &change{service: svc, previous: previous}
		t.changes[k] = c
	}
	c.current = current
	if !trigger.IsZero() {
		c.triggers = append(c.triggers, trigger)
	}
	t.total[k.kind]++
	if sameObject(c.previous, c.current) {
		delete(t.changes, k)
		t.settled[k] = current
		return false
	}
	delete(t.settled, k)
	return true
}

// sameObject compares what steelyard reads of an object: its UID (a
// recreated object is a new one: annotations keep no memory across), metadata
// labels and annotations, the Service spec, the slice's endpoints and ports.
func sameObject(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case *corev1.Service:
		y, ok := b.(*corev1.Service)
		return ok && x.UID == y.UID && apiequality.Semantic.DeepEqual(x.Labels, y.Labels) &&
			apiequality.Semantic.DeepEqual(x.Annotations, y.Annotations) &&
			apiequality.Semantic.DeepEqual(x.Spec, y.Spec) &&
			apiequality.Semantic.DeepEqual(x.Status.LoadBalancer, y.Status.LoadBalancer)
	case *discoveryv1.EndpointSlice:
		y, ok := b.(*discoveryv1.EndpointSlice)
		return ok && x.UID == y.UID && apiequality.Semantic.DeepEqual(x.Labels, y.Labels) &&
			apiequality.Semantic.DeepEqual(x.Annotations, y.Annotations) &&
			x.AddressType == y.AddressType &&
			apiequality.Semantic.DeepEqual(x.Endpoints, y.Endpoints) &&
			apiequality.Semantic.DeepEqual(x.Ports, y.Ports)
	}
	return false
}

// Pending returns how many Services and EndpointSlices have a real change
// waiting for a sync.
func (t *ChangeTracker) Pending() (services, slices int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.changes {
		if k.kind == KindService {
			services++
		} else {
			slices++
		}
	}
	return services, slices
}

// Total returns how many Service and EndpointSlice events the tracker has
// seen.
func (t *ChangeTracker) Total() (services, slices int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total[KindService], t.total[KindEndpointSlice]
}

// Drained is what a sync takes from the tracker.
type Drained struct {
	// Services had real changes (their own or their slices').
	Services map[types.NamespacedName]bool
	// Triggers are the endpoint-change times the sync will program.
	Triggers []time.Time
	// Objects are the objects that changed, as they are now (for
	// Builder.Update), including those whose changes cancelled out.
	Objects []ObjectChange
}

// Drain returns the pending changes and starts a new round: what is
// current now becomes the previous state of the next one.
func (t *ChangeTracker) Drain() Drained {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := Drained{Services: make(map[types.NamespacedName]bool, len(t.changes))}
	out.Objects = make([]ObjectChange, 0, len(t.changes)+len(t.settled))
	for k, c := range t.changes {
		out.Services[c.service] = true
		out.Triggers = append(out.Triggers, c.triggers...)
		out.Objects = append(out.Objects, ObjectChange{Kind: k.kind, Name: k.name, Object: c.current})
	}
	for k, cur := range t.settled {
		out.Objects = append(out.Objects, ObjectChange{Kind: k.kind, Name: k.name, Object: cur})
	}
	t.changes = map[objectKey]*change{}
	t.settled = map[objectKey]any{}
	return out
}
