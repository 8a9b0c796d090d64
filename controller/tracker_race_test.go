package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// racingSource is a ClusterSource whose next Load first lets an informer
// event run on its own goroutine (the reflector's) and gives it up to
// 200 ms: an event that lands between the agent's Drain and its Load,
// unless the source keeps its stores still meanwhile.
type racingSource struct {
	*ClusterSource
	event func()
	done  chan struct{}
}

func (s *racingSource) Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error) {
	if f := s.event; f != nil {
		s.event = nil
		s.done = make(chan struct{})
		go func() { defer close(s.done); f() }()
		select {
		case <-s.done:
		case <-time.After(200 * time.Millisecond):
		}
	}
	return s.ClusterSource.Load()
}

// An EndpointSlice change racing with a sync must not leave the kernel on a
// state the tracker no longer knows: w-2 turns not ready while a sync is
// between its Drain and its Load, and back to ready before the next sync.
// Before the fix the first sync built the middle state (w-2 not ready)
// while the tracker compared the next event with the state at the Drain, so
// the revert looked like no change and the kernel kept w-2 out until the
// slice's next change or the next full sync (an hour by default).
func TestAgentChangeBetweenDrainAndLoadThenReverted(t *testing.T) {
	cs, err := NewClusterSource(fake.NewClientset(), ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs.svcStore.changed = trackWith(cs.Tracker.ServiceChanged, func() {})
	cs.sliceStore.changed = trackWith(cs.Tracker.SliceChanged, func() {})
	src := &racingSource{ClusterSource: cs}
	svc := makeService("demo", "web", withIP("198.18.0.40"))
	slice := func(w2 string) *discoveryv1.EndpointSlice {
		return makeSlice("demo", "web", "web-1", []discoveryv1.Endpoint{ready("198.19.40.1", "w-1"), endpoint("198.19.40.2", "w-2", w2)}, nil)
	}
	for _, err := range []error{cs.svcStore.Update(svc), cs.sliceStore.Update(slice(condReady))} {
		if err != nil {
			t.Fatal(err)
		}
	}
	d := &recordingDataplane{}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a := &Agent{Source: src, Tracker: cs.Tracker, Builder: NewBuilder(), Dataplane: d, FullSyncPeriod: time.Hour,
		Clock: clk}
	active := func(what string, want int) {
		t.Helper()
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
		if src.done != nil {
			<-src.done
		}
		web := byName(d.last)["demo/web:http"]
		if n := len(web.Active()); n != want {
			t.Errorf("%s: %d active endpoints programmed, want %d", what, n, want)
		}
	}
	active("first sync", 2)
	// Another Service is added, and the full sync period passes: the next
	// sync reads the stores (partial syncs work from the drained objects
	// and never Load, so only a full sync has this window).
	if err := cs.svcStore.Update(makeService("demo", "other", withIP("198.18.0.41"))); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Hour)
	src.event = func() { _ = cs.sliceStore.Update(slice(condNotReady)) }
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if src.done == nil {
		t.Fatal("the full sync did not read the source")
	}
	<-src.done
	// Whatever that sync saw, w-2 is ready again now: the next syncs must
	// program both endpoints.
	if err := cs.sliceStore.Update(slice(condReady)); err != nil {
		t.Fatal(err)
	}
	active("the sync after the revert", 2)
	active("a periodic sync", 2)
}
