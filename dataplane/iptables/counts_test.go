package iptables

import (
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// countDNAT adds n to the packet counter of the DNAT rule of endpoint b's
// chain, as n new connections through it would.
func countDNAT(t *testing.T, f *Fake, sp dataplane.ServicePort, b dataplane.Backend, n uint64) {
	t.Helper()
	sep := EndpointChain(sp.Name, sp.VIP.Protocol, b)
	c := f.Ruleset().Chain(TableNAT, sep)
	if c == nil {
		t.Fatalf("no chain %s", sep)
	}
	for i, r := range c.Rules {
		if r.Jump == "DNAT" {
			if err := f.Count(TableNAT, sep, i, n); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no DNAT rule in %s", sep)
}

// The endpoint counts' life: the DNAT rule's own counter, read by Counts
// from one iptables-save -c; kept through a weight change, a full resync
// after a flush and an agent restart (the fake kernel zeroes the counters
// of a chain a restore rewrites, as the kernel does, so a needless
// rewrite fails here); gone with the endpoint.
func TestEndpointCounts(t *testing.T) {
	cfg := parityCfg
	cfg.CountConnections = true
	f := NewFake()
	p := NewProxier(f, cfg)
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	sync := func(req dataplane.SyncRequest, sps ...dataplane.ServicePort) {
		t.Helper()
		if _, err := p.Sync(dataplane.State{Services: sps}, req); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	sync(dataplane.FullSync, web)
	// Counting changes no rule: the same ruleset as with it off (the
	// counters are always there; the flag only exports them).
	off := NewFake()
	if _, err := NewProxier(off, parityCfg).Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	on, _ := f.SaveAll()
	if saved, _ := off.SaveAll(); string(saved) != string(on) {
		t.Errorf("counting on changed the rules:\n%s\nagainst off:\n%s", on, saved)
	}
	want := func(what string, counts map[string]uint64) {
		t.Helper()
		got, err := p.Counts()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(counts) {
			t.Errorf("%s: %d counts %+v, want %v", what, len(got), got, counts)
		}
		for _, c := range got {
			n, ok := counts[c.Endpoint.String()]
			if c.Service != "ns/web:http" || c.Protocol != dataplane.TCP || !ok || c.NewConnections != n {
				t.Errorf("%s: %+v, want %s with %d", what, c, c.Endpoint, n)
			}
		}
	}
	want("before traffic", map[string]uint64{"198.19.1.2:8080": 0, "198.19.1.3:8080": 0})
	countDNAT(t, f, web, web.Backends[0], 3)
	countDNAT(t, f, web, web.Backends[1], 27)
	want("after traffic", map[string]uint64{"198.19.1.2:8080": 3, "198.19.1.3:8080": 27})

	// A weight change rewrites the split chain only; a full resync after
	// a flush of the Service chain rewrites that; a new Proxier (an agent
	// restart) finds every chain in place. The counts stay.
	web.Detach() // the record shares the synced Backends
	web.Backends[0].Weight = 50
	sync(dataplane.PartialSync, web)
	if err := f.Restore([]byte("*nat\n-F STEELYARD-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	sync(dataplane.FullSync, web)
	p = NewProxier(f, cfg)
	sync(dataplane.FullSync, web)
	want("after a weight change, a full resync and a restart", map[string]uint64{"198.19.1.2:8080": 3, "198.19.1.3:8080": 27})

	// Session affinity rewrites the endpoint chains (their DNAT rule gains
	// -m recent --set): the counts start again, which Prometheus' rate()
	// reads as a counter reset.
	web.AffinitySeconds = 600
	sync(dataplane.PartialSync, web)
	want("after affinity was turned on", map[string]uint64{"198.19.1.2:8080": 0, "198.19.1.3:8080": 0})
	countDNAT(t, f, web, web.Backends[1], 5)

	// The endpoint goes: its count with it.
	web.Backends = web.Backends[1:]
	sync(dataplane.PartialSync, web)
	want("after the endpoint left", map[string]uint64{"198.19.1.3:8080": 5})
}

// Cleanup deletes the per-endpoint nfacct objects of an older release
// (after the rules that named them), and no other object.
func TestCleanupDeletesLegacyCounters(t *testing.T) {
	acct := &fakeAcct{}
	if err := acct.Ensure("sy-ep-AAAAAAAAAAAAAA", "sy-ep-BBBBBBBBBBBBBB", LocalhostCounter, "someone-elses"); err != nil {
		t.Fatal(err)
	}
	cfg := parityCfg
	cfg.NFAcct = acct
	f := NewFake()
	p := NewProxier(f, cfg)
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if err := p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sy-ep-AAAAAAAAAAAAAA", "sy-ep-BBBBBBBBBBBBBB"} {
		if _, ok := acct.objs[n]; ok {
			t.Errorf("cleanup left %s", n)
		}
	}
	for _, n := range []string{LocalhostCounter, "someone-elses"} {
		if _, ok := acct.objs[n]; !ok {
			t.Errorf("cleanup deleted %s", n)
		}
	}
}
