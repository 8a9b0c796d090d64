//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// caseObservedShares proves the kernel's count of new connections per
// endpoint (issue 23): 20,000 connections at 10/90 (sigma of the 10%
// share: 0.21 points, so 1 point is 4.7 sigma; shares_test.go), and the
// count of each endpoint read by `explain --observed` must equal the
// client's own count of the connections that endpoint answered. Equal is a
// real check because no connection may fail: a connection that timed out
// may have been counted by the kernel without the client knowing where it
// went, so one failure fails the case instead of being excused. Then a
// change of another Service syncs the table, and the counts must stay.
func caseObservedShares(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(webService, quadService)
	f.write("services.yaml", webService)
	f.start("--count-connections")

	before := f.observed("198.18.0.10", 80)
	if before.Total != 0 || before.Verdict != dataplane.VerdictNoData {
		t.Fatalf("before any traffic: %d connections counted (%s), want none", before.Total, before.Verdict)
	}

	// A 10 s bound per connection: under load a slow accept must not turn
	// into a failure (and a failure fails the case, see above).
	r, err := f.client.TCPConns(addrPort(webService.vip, 80), tcp1090Conns, sandbox.Load{Timeout: 10 * time.Second, MaxDuration: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed() > 0 || r.Attempted != r.Requested {
		t.Fatalf("%d of %d connections failed, %d not attempted (%v): the kernel's count cannot be compared", r.Failed(), r.Requested, r.Requested-r.Attempted, r.Errors)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 1)

	text, err := f.steelyard(append([]string{"explain", "--observed"}, f.modeArgs()...)...)
	if err != nil {
		t.Fatalf("explain --observed: %v\n%s", err, text)
	}
	t.Logf("explain --observed (%s):\n%s", m.name, text)
	got := f.observed("198.18.0.10", 80)
	names := map[string]string{}
	for _, p := range webService.endpoints {
		names[p.ip] = p.name
	}
	viewcheck.ExpectObserved(t, got, r, names, map[string]float64{"web-1": 10, "web-2": 90}, 1)

	// Another Service comes: the table is synced, web's counters stay.
	f.write("services.yaml", webService, quadService)
	f.waitVerify(20 * time.Second)
	after := f.observed("198.18.0.10", 80)
	for i, b := range after.Backends {
		if b.Count != got.Backends[i].Count {
			t.Errorf("after a sync for another Service: %s:%d counts %d, want %d (kept)", b.IP, b.Port, b.Count, got.Backends[i].Count)
		}
	}
}

// observed returns the observed view of one clusterIP from `explain
// --observed -o json`.
func (f *fixture) observed(vip string, port uint16) dataplane.ObservedView {
	f.t.Helper()
	out, err := f.steelyard(append([]string{"explain", "--observed", "-o", "json"}, f.modeArgs()...)...)
	if err != nil {
		f.t.Fatalf("explain --observed: %v\n%s", err, out)
	}
	return viewcheck.FindObserved(f.t, out, vip, port)
}
