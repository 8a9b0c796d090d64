package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

// staticSource is a Snapshot over fixed objects.
type staticSource struct {
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
}

func (s *staticSource) Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error) {
	return s.svcs, s.slices, nil
}

func liveShares(t *testing.T, f *iptables.Fake) map[string]string {
	t.Helper()
	views, err := iptables.Views(f.Ruleset())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, v := range views {
		out[v.Service] = v.Line()
	}
	return out
}

// The agent end to end over the fake kernel: a broken annotation on one
// Service keeps its last valid weights and never stops the others.
func TestAgentBadAnnotationKeepsLastValidAndOthersSync(t *testing.T) {
	web := makeService("demo", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Annotations = map[string]string{AnnotationWeights: "web-1=10,web-2=90"}
	})
	api := makeService("demo", "api", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.11" })
	src := &staticSource{
		svcs: []*corev1.Service{web, api},
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "web-1", condReady), endpoint("198.19.1.3", "web-2", condReady)}, nil),
			makeSlice("demo", "api", "api-a", []discoveryv1.Endpoint{endpoint("198.19.1.4", "api-1", condReady)}, nil),
		},
	}
	f := iptables.NewFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: iptables.NewProxier(f, iptables.Config{}), SyncPeriod: time.Minute, Clock: clk}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := liveShares(t, f)["demo/web:http"]; !strings.Contains(got, "198.19.1.2:8080 10.00%  198.19.1.3:8080 90.00%") {
		t.Fatalf("web: %s", got)
	}

	// web's annotation breaks; api gains an endpoint in the same sync.
	web2 := web.DeepCopy()
	web2.Annotations[AnnotationWeights] = "web-1=10,web-1=90"
	src.svcs = []*corev1.Service{web2, api}
	src.slices[1] = makeSlice("demo", "api", "api-a", []discoveryv1.Endpoint{endpoint("198.19.1.4", "api-1", condReady), endpoint("198.19.1.5", "api-2", condReady)}, nil)
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	live := liveShares(t, f)
	if got := live["demo/web:http"]; !strings.Contains(got, "10.00%") || !strings.Contains(got, "90.00%") {
		t.Errorf("web lost its last valid weights: %s", got)
	}
	if got := live["demo/api:http"]; !strings.Contains(got, "198.19.1.5:8080 50.00%") {
		t.Errorf("api did not sync: %s", got)
	}
}

// failingDataplane fails every Sync and records the full flags it saw.
type failingDataplane struct {
	dataplane.Dataplane
	fulls []bool
	fail  bool
}

func (d *failingDataplane) Sync(_ dataplane.State, full bool) error {
	d.fulls = append(d.fulls, full)
	if d.fail {
		return errors.New("restore failed")
	}
	return nil
}

func TestAgentFullSyncPeriodAndAfterFailure(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	d := &failingDataplane{}
	a := &Agent{Source: &staticSource{}, Builder: NewBuilder(), Dataplane: d, SyncPeriod: time.Minute, Clock: clk}
	step := func(by time.Duration, fail bool) error {
		clk.Step(by)
		d.fail = fail
		return a.Sync()
	}
	_ = step(0, false)             // first: full
	_ = step(time.Second, false)   // partial
	_ = step(time.Minute, false)   // period over: full
	err := step(time.Second, true) // partial, fails
	_ = step(time.Second, false)   // after a failure: full
	_ = step(time.Second, false)   // partial again
	if !errors.Is(err, ErrSync) {
		t.Errorf("failed sync returned %v, want ErrSync", err)
	}
	want := []bool{true, false, true, false, true, false}
	for i := range want {
		if d.fulls[i] != want[i] {
			t.Fatalf("full flags %v, want %v", d.fulls, want)
		}
	}
}

func TestAgentRecordsInvalidWeightsEventOnce(t *testing.T) {
	web := makeService("demo", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Annotations = map[string]string{AnnotationWeights: "web-1=ten"}
	})
	rec := record.NewFakeRecorder(10)
	a := &Agent{Source: &staticSource{svcs: []*corev1.Service{web}}, Builder: NewBuilder(),
		Dataplane: iptables.NewProxier(iptables.NewFake(), iptables.Config{}), SyncPeriod: time.Minute, Events: rec}
	for range 3 {
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	close(rec.Events)
	var events []string
	for e := range rec.Events {
		events = append(events, e)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning InvalidWeights demo/web: annotation steelyard.io/weights") {
		t.Errorf("events %q, want one Warning InvalidWeights naming the annotation", events)
	}
}
