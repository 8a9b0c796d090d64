package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
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
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: iptables.NewProxier(f, iptables.Config{}), FullSyncPeriod: time.Minute, Clock: clk}
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

func (d *failingDataplane) Sync(_ dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	d.fulls = append(d.fulls, req.Full)
	if d.fail {
		return dataplane.SyncResult{}, errors.New("restore failed")
	}
	return dataplane.SyncResult{Full: req.Full}, nil
}

func TestAgentFullSyncPeriodAndAfterFailure(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	d := &failingDataplane{}
	a := &Agent{Source: &staticSource{}, Builder: NewBuilder(), Dataplane: d, FullSyncPeriod: time.Minute, Clock: clk}
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
		Dataplane: iptables.NewProxier(iptables.NewFake(), iptables.Config{}), FullSyncPeriod: time.Minute, Events: rec}
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

// Periodic syncs are partial; only FullSyncPeriod brings a full one. A
// zero FullSyncPeriod falls back to SyncPeriod (the old single period).
func TestAgentPeriodicSyncsArePartial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		period time.Duration
		want   []bool // at 0, +30s, +30m, +60m, +61m
	}{
		{"full every hour", time.Hour, []bool{true, false, false, true, false}},
		{"zero: every sync full", 0, []bool{true, true, true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			d := &failingDataplane{}
			a := &Agent{FullSyncPeriod: tc.period, Source: &staticSource{}, Builder: NewBuilder(), Dataplane: d, Clock: clk}
			start := clk.Now()
			for _, at := range []time.Duration{0, 30 * time.Second, 30 * time.Minute, time.Hour, 61 * time.Minute} {
				clk.SetTime(start.Add(at))
				if err := a.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			if fmt.Sprint(d.fulls) != fmt.Sprint(tc.want) {
				t.Errorf("full flags %v, want %v", d.fulls, tc.want)
			}
		})
	}
}

// Over the fake kernel with the real proxier: a hand edit waits for the
// full sync, a flushed table is put back by the next periodic sync (the
// dataplane's canary), and nothing is rewritten in between.
func TestAgentRepairsFlushAtOnceAndHandEditsAtFullSync(t *testing.T) {
	web := makeService("demo", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Annotations = map[string]string{AnnotationWeights: "web-1=10,web-2=90"}
	})
	src := &staticSource{
		svcs:   []*corev1.Service{web},
		slices: []*discoveryv1.EndpointSlice{makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "web-1", condReady), endpoint("198.19.1.3", "web-2", condReady)}, nil)},
	}
	f := iptables.NewFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := iptables.NewProxier(f, iptables.Config{})
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: p, FullSyncPeriod: time.Hour, Clock: clk}
	sync := func(after time.Duration) {
		t.Helper()
		clk.Step(after)
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	sync(0)
	want := liveShares(t, f)
	if !strings.Contains(want["demo/web:http"], "90.00%") {
		t.Fatalf("first sync: %v", want)
	}

	// A hand edit: the periodic (partial) syncs leave it, the full one
	// repairs it.
	svcChain := iptables.ServiceChain(dataplane.ServicePortName{Namespace: "demo", Name: "web", Port: "http"}, dataplane.TCP)
	if err := f.DeleteRuleAt(iptables.TableNAT, svcChain, 1); err != nil {
		t.Fatal(err)
	}
	broken := liveShares(t, f)["demo/web:http"]
	restores := f.Restores
	sync(30 * time.Second)
	sync(30 * time.Second)
	if got := liveShares(t, f)["demo/web:http"]; got != broken || f.Restores != restores {
		t.Errorf("a periodic sync touched the kernel: %s, restores %d -> %d", got, restores, f.Restores)
	}
	sync(time.Hour)
	if got := liveShares(t, f)["demo/web:http"]; got != want["demo/web:http"] {
		t.Errorf("after the full sync: %s, want %s", got, want["demo/web:http"])
	}

	// A firewall reload flushes everything: the next periodic sync sees
	// the canary gone and puts everything back.
	f.FlushTable(iptables.TableNAT)
	f.FlushTable(iptables.TableFilter)
	sync(30 * time.Second)
	if !p.LastSync.Full || !p.LastSync.CanaryMissing {
		t.Errorf("sync after the flush: %+v, want full (canary missing)", p.LastSync)
	}
	if got := liveShares(t, f)["demo/web:http"]; got != want["demo/web:http"] {
		t.Errorf("after the flush and a periodic sync: %s, want %s", got, want["demo/web:http"])
	}

	// That sync counts as full: the next full one is an hour after it,
	// not an hour after the previous one (30 s earlier).
	if err := f.DeleteRuleAt(iptables.TableNAT, svcChain, 1); err != nil {
		t.Fatal(err)
	}
	sync(time.Hour - 15*time.Second)
	if p.LastSync.Full {
		t.Errorf("full sync %v after a canary-forced full one, want partial until an hour has passed", time.Hour-15*time.Second)
	}
	sync(15 * time.Second)
	if !p.LastSync.Full {
		t.Errorf("no full sync an hour after the canary-forced one")
	}
}

// The agent runs behind the health-check wrapper in production: a sync the
// dataplane turned full on its own (canary gone) must still be counted,
// timed and logged as full through the wrapper (issue 11: it was hidden).
func TestAgentSeesFullSyncThroughHealthChecks(t *testing.T) {
	web := makeService("demo", "web", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.10" })
	src := &staticSource{
		svcs:   []*corev1.Service{web},
		slices: []*discoveryv1.EndpointSlice{makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "web-1", condReady)}, nil)},
	}
	f := iptables.NewFake()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := NewMetrics()
	hc := NewHealthChecks(iptables.NewProxier(f, iptables.Config{}), netip.MustParseAddr("127.0.0.1"))
	defer hc.Close()
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: hc, FullSyncPeriod: time.Hour, Clock: clk, Metrics: m}
	sync := func(after time.Duration) {
		t.Helper()
		clk.Step(after)
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	sync(0)                // first: full
	sync(30 * time.Second) // partial
	f.FlushTable(iptables.TableNAT)
	f.FlushTable(iptables.TableFilter)
	sync(30 * time.Second) // asked partial, the canary makes it full
	_, body := get(t, m.Handler(), "/metrics")
	for _, want := range []string{
		"steelyard_sync_full_proxy_rules_duration_seconds_count 2",
		"steelyard_sync_partial_proxy_rules_duration_seconds_count 1",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// resultDataplane returns a fixed result and keeps the requests it saw.
type resultDataplane struct {
	failingDataplane
	res  dataplane.SyncResult
	reqs []dataplane.SyncRequest
}

func (d *resultDataplane) Sync(_ dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	d.reqs = append(d.reqs, req)
	return d.res, nil
}

// The Services whose ports changed reach the dataplane: here a new slice
// of web-canary changes its ports and those of web, which splits across
// it; old, whose split never parsed, has no ports that changed, and other
// is untouched.
func TestAgentPassesChangedServices(t *testing.T) {
	tr := NewChangeTracker()
	split := makeService("demo", "web", withAnnotation(AnnotationSplit, "web-stable=90,web-canary=10"))
	broken := makeService("demo", "old", withAnnotation(AnnotationSplit, "not a split"))
	broken.Spec.ClusterIP = "198.18.0.2"
	other := makeService("demo", "other", withIP("198.18.0.3"))
	canary := makeService("demo", "web-canary", withIP("198.18.0.4"))
	d := &resultDataplane{}
	a := &Agent{Source: &staticSource{svcs: []*corev1.Service{split, broken, other, canary}}, Tracker: tr, Builder: NewBuilder(), Dataplane: d,
		FullSyncPeriod: time.Hour, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	if err := a.Sync(); err != nil { // first: full, nothing changed
		t.Fatal(err)
	}
	tr.SliceChanged(nil, makeSlice("demo", "web-canary", "web-canary-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "c-1", condReady)}, nil))
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	req := d.reqs[1]
	want := map[dataplane.ServiceName]bool{{Namespace: "demo", Name: "web"}: true, {Namespace: "demo", Name: "web-canary"}: true}
	if req.Full || fmt.Sprint(req.Changed) != fmt.Sprint(want) {
		t.Errorf("request %+v, want partial with %v", req, want)
	}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	if req := d.reqs[2]; req.Changed == nil || len(req.Changed) != 0 {
		t.Errorf("nothing changed: request %+v, want an empty changed set", req)
	}
}

// A result's RequeueAfter becomes one Requeue call once that time passed.
func TestAgentRequeuesAfterResult(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	requeued := make(chan struct{}, 10)
	d := &resultDataplane{res: dataplane.SyncResult{RequeueAfter: time.Second}}
	a := &Agent{Source: &staticSource{}, Builder: NewBuilder(), Dataplane: d, FullSyncPeriod: time.Hour, Clock: clk,
		Requeue: func() { requeued <- struct{}{} }}
	for range 2 { // two syncs, one pending call
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	clk.Step(999 * time.Millisecond)
	select {
	case <-requeued:
		t.Fatal("requeued early")
	default:
	}
	clk.Step(time.Millisecond)
	select {
	case <-requeued:
	case <-time.After(5 * time.Second):
		t.Fatal("no requeue after RequeueAfter")
	}
	select {
	case <-requeued:
		t.Error("requeued twice for one pending RequeueAfter")
	case <-time.After(50 * time.Millisecond):
	}
}

type fixedRoutes struct{ r Routes }

func (f *fixedRoutes) Routes([]*corev1.Service) Routes { return f.r }

// Route changes do not pass through the Service tracker: the ports routes
// make, now or at the last sync, are in every partial sync's changed set,
// so a route that changes or goes away is written.
func TestAgentChangedSetHasRoutePorts(t *testing.T) {
	tr := NewChangeTracker()
	routes := &fixedRoutes{r: Routes{
		Listeners: []ListenerRoute{{Name: dataplane.ServicePortName{Namespace: "demo", Name: "gw", Port: "tcp/TCPRoute/demo/r"},
			VIP: dataplane.VIP{IP: netip.MustParseAddr("198.18.200.1"), Port: 9000, Protocol: dataplane.TCP}}},
		Services: []ServiceRoute{{Service: types.NamespacedName{Namespace: "demo", Name: "web"}, Protocol: dataplane.TCP, Route: "TCPRoute/demo/g"}},
	}}
	d := &resultDataplane{}
	a := &Agent{Source: &staticSource{}, Tracker: tr, Builder: NewBuilder(), Dataplane: d, Routes: routes,
		FullSyncPeriod: time.Hour, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	if err := a.Sync(); err != nil { // first: full
		t.Fatal(err)
	}
	routes.r = Routes{} // both routes deleted: nothing in the tracker
	for i, want := range []map[dataplane.ServiceName]bool{
		{{Namespace: "demo", Name: "gw"}: true, {Namespace: "demo", Name: "web"}: true}, // removed since the last sync
		{}, // and gone from the next one
	} {
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
		req := d.reqs[i+1]
		if req.Full || fmt.Sprint(req.Changed) != fmt.Sprint(want) {
			t.Errorf("sync %d: request %+v, want partial with %v", i+1, req, want)
		}
	}
}

// A new zone (or NodeChanged, from the Node watch) reaches every Service's
// ports: that partial sync's changed set is unknown (nil), the next one's
// is the tracker's again.
func TestAgentNodeChangeLooksAtEveryPort(t *testing.T) {
	tr := NewChangeTracker()
	d := &resultDataplane{}
	zone := "zone-a"
	a := &Agent{Source: &staticSource{}, Tracker: tr, Builder: NewBuilder(), Dataplane: d, Zone: func() string { return zone },
		FullSyncPeriod: time.Hour, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	for _, step := range []struct {
		do      func()
		unknown bool
	}{
		{func() {}, false}, // first sync: full
		{func() { zone = "zone-b" }, true},
		{func() {}, false},
		{a.NodeChanged, true},
		{func() {}, false},
	} {
		step.do()
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	for i, unknown := range []bool{true, false, true, false} {
		if req := d.reqs[i+1]; req.Full || (req.Changed == nil) != unknown {
			t.Errorf("sync %d: request %+v, want partial with the changed set unknown=%v", i+1, req, unknown)
		}
	}
}
