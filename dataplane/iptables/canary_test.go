package iptables

import (
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// A firewall reload flushes every table: the next partial Sync finds the
// canary gone, runs full instead and puts everything back.
func TestPartialSyncFindsFlushedTablesAndGoesFull(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	state := dataplane.State{Services: []dataplane.ServicePort{web}}
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(state, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// Canary in place: a partial Sync stays partial and writes nothing.
	restores := f.Restores
	if _, err := p.Sync(state, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if st := p.LastSync; st.Full || st.CanaryMissing || f.Restores != restores {
		t.Fatalf("partial sync over intact tables: stats %+v, restores %d -> %d", st, restores, f.Restores)
	}

	for _, tc := range []struct {
		name   string
		tables []Table
		broken bool // verify fails after the flush
	}{
		{"every table", []Table{TableNAT, TableFilter}, true},
		// Nothing in filter that explain reads here, but the jumps are gone.
		{"filter only", []Table{TableFilter}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, tb := range tc.tables {
				f.FlushTable(tb)
			}
			if diff := dataplane.Diff(dataplane.Expected(state), mustViews(t, f)); tc.broken && len(diff) == 0 {
				t.Fatal("verify would pass after the flush")
			}
			if _, err := p.Sync(state, dataplane.PartialSync); err != nil {
				t.Fatal(err)
			}
			if st := p.LastSync; !st.Full || !st.CanaryMissing {
				t.Errorf("stats %+v, want a full sync forced by the missing canary", st)
			}
			if diff := dataplane.Diff(dataplane.Expected(state), mustViews(t, f)); len(diff) > 0 {
				t.Errorf("still differs after the sync:\n%s", strings.Join(diff, "\n"))
			}
			if ok, err := f.HasRule(canary.table, canary.from, canary.args...); err != nil || !ok {
				t.Errorf("canary not back: %v %v", ok, err)
			}
		})
	}
}

// The canary lives in the small filter table (cheap to read): a flush of
// the nat table alone is not seen by partial syncs, and the next full sync
// repairs it.
func TestNATOnlyFlushWaitsForTheFullSync(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	state := dataplane.State{Services: []dataplane.ServicePort{web}}
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(state, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	f.FlushTable(TableNAT)
	if _, err := p.Sync(state, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if p.LastSync.Full {
		t.Errorf("a nat-only flush made a partial sync full: %+v", p.LastSync)
	}
	if _, err := p.Sync(state, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(state), mustViews(t, f)); len(diff) > 0 {
		t.Errorf("the full sync did not repair the nat table:\n%s", strings.Join(diff, "\n"))
	}
}
