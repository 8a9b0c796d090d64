package controller

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// endpointsDataplane keeps the endpoints of every State it was given.
type endpointsDataplane struct{ got []map[string][]string }

func (d *endpointsDataplane) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	m := map[string][]string{}
	for _, sp := range s.Services {
		for _, b := range sp.Active() {
			m[sp.Name.String()] = append(m[sp.Name.String()], b.IP.String())
		}
	}
	d.got = append(d.got, m)
	return dataplane.SyncResult{Full: req.Full}, nil
}
func (d *endpointsDataplane) Explain() ([]dataplane.ServiceView, error) { return nil, nil }
func (d *endpointsDataplane) Cleanup() error                            { return nil }

// A sync with nothing changed reuses the last state; a change after it is
// seen, and a sync with nothing changed after that one gives the new state,
// not the first one.
func TestAgentNothingChangedReusesTheLastState(t *testing.T) {
	web := makeService("demo", "web", withIP("198.18.0.10"))
	slice := makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "web-1", condReady)}, nil)
	src := &staticSource{svcs: []*corev1.Service{web}, slices: []*discoveryv1.EndpointSlice{slice}}
	tr := NewChangeTracker()
	d := &endpointsDataplane{}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a := &Agent{Source: src, Tracker: tr, Builder: NewBuilder(), Dataplane: d, FullSyncPeriod: time.Hour, Clock: clk}
	sync := func() map[string][]string {
		t.Helper()
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
		return d.got[len(d.got)-1]
	}
	want := func(got map[string][]string, ip string) {
		t.Helper()
		if e := got["demo/web:http"]; len(e) != 1 || e[0] != ip {
			t.Fatalf("endpoints %v, want [%s]", got, ip)
		}
	}
	want(sync(), "198.19.1.2") // full
	clk.Step(time.Second)
	want(sync(), "198.19.1.2") // nothing changed

	changed := makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.3", "web-1", condReady)}, nil)
	src.slices = []*discoveryv1.EndpointSlice{changed}
	tr.SliceChanged(slice, changed)
	want(sync(), "198.19.1.3")
	clk.Step(time.Second)
	want(sync(), "198.19.1.3") // nothing changed again: the new state

	// A node change (here the zone) rebuilds even with the tracker empty.
	zone := "a"
	a.Zone = func() string { return zone }
	src.slices = []*discoveryv1.EndpointSlice{makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.4", "web-1", condReady)}, nil)}
	want(sync(), "198.19.1.4")
}

// BenchmarkAgentSyncNothingChanged10kx10 is a periodic sync with nothing
// changed at 10,000 Services x 10 endpoints, the dataplane left out: what
// the agent itself costs on every such sync.
func BenchmarkAgentSyncNothingChanged10kx10(b *testing.B) {
	src := &staticSource{}
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("svc-%d", i)
		src.svcs = append(src.svcs, makeService("bench", name, withIP(fmt.Sprintf("198.18.%d.%d", (i+1)>>8, (i+1)&0xff))))
		var eps []discoveryv1.Endpoint
		for j := 0; j < 10; j++ {
			k := i*10 + j
			eps = append(eps, endpoint(fmt.Sprintf("198.19.%d.%d", (k>>8)&0xff, k&0xff), fmt.Sprintf("%s-%d", name, j), condReady))
		}
		src.slices = append(src.slices, makeSlice("bench", name, name+"-a", eps, nil))
	}
	a := &Agent{Source: src, Tracker: NewChangeTracker(), Builder: NewBuilder(), Dataplane: &nopDataplane{}, FullSyncPeriod: time.Hour}
	if err := a.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := a.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

func (d *endpointsDataplane) Counts() ([]dataplane.EndpointCount, error) { return nil, nil }
