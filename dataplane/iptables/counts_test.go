package iptables

import (
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
)

// The endpoint counters' life: created before the restore that names
// them, kept through a weight change and a full resync, deleted with the
// endpoint, read back by Counts from the live rules.
func TestEndpointCounters(t *testing.T) {
	acct := &fakeAcct{}
	cfg := parityCfg
	cfg.NFAcct, cfg.CountConnections = acct, true
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
	names := map[string]string{}
	for _, b := range web.Backends {
		n := EndpointCounter(EndpointChain(web.Name, web.VIP.Protocol, b))
		if len(n) > nfacct.MaxNameLen {
			t.Errorf("counter %s: %d characters, nfacct takes %d", n, len(n), nfacct.MaxNameLen)
		}
		names[b.Addr().String()] = n
	}
	for ep, n := range names {
		if _, err := acct.Get(n); err != nil {
			t.Errorf("counter of %s not created: %v", ep, err)
		}
	}
	saved, _ := f.SaveAll()
	if got := strings.Count(string(saved), "-m nfacct --nfacct-name "+counterPrefix); got != 2 {
		t.Errorf("%d DNAT rules name a counter, want 2:\n%s", got, saved)
	}
	// The views still agree with the desired state (the match counts, it
	// does not filter).
	views, err := p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(dataplane.State{Services: []dataplane.ServicePort{web}}), views); len(diff) > 0 {
		t.Errorf("views with counters:\n%s", strings.Join(diff, "\n"))
	}

	// The kernel counts: 3 and 27.
	acct.objs[names["198.19.1.2:8080"]] = nfacct.Counter{Name: names["198.19.1.2:8080"], Packets: 3}
	acct.objs[names["198.19.1.3:8080"]] = nfacct.Counter{Name: names["198.19.1.3:8080"], Packets: 27}
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
			if c.Service != "ns/web:http" || c.Protocol != dataplane.TCP || c.NewConnections != counts[c.Endpoint.String()] {
				t.Errorf("%s: %+v, want %s with %d", what, c, c.Endpoint, counts[c.Endpoint.String()])
			}
		}
	}
	want("after traffic", map[string]uint64{"198.19.1.2:8080": 3, "198.19.1.3:8080": 27})

	// A weight change rewrites the split chain only; a full resync after
	// a flush rewrites everything; the counters stay.
	web.Backends[0].Weight = 50
	sync(dataplane.PartialSync, web)
	if err := f.Restore([]byte("*nat\n-F STEELYARD-SERVICES\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	sync(dataplane.FullSync, web)
	want("after a weight change and a full resync", map[string]uint64{"198.19.1.2:8080": 3, "198.19.1.3:8080": 27})

	// The endpoint goes: its counter goes after the restore.
	web.Backends = web.Backends[1:]
	sync(dataplane.PartialSync, web)
	if _, err := acct.Get(names["198.19.1.2:8080"]); err != nfacct.ErrNotFound {
		t.Errorf("counter of a removed endpoint: %v, want it deleted", err)
	}
	want("after the endpoint left", map[string]uint64{"198.19.1.3:8080": 27})

	// Cleanup deletes the rest.
	if err := p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if len(acct.objs) != 0 {
		t.Errorf("counters left after cleanup: %v", acct.objs)
	}
}

// Counting off: no rule names a counter, none is created, Counts is empty.
func TestEndpointCountersOff(t *testing.T) {
	acct := &fakeAcct{}
	cfg := parityCfg
	cfg.NFAcct = acct
	f := NewFake()
	p := NewProxier(f, cfg)
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if saved, _ := f.SaveAll(); strings.Contains(string(saved), counterPrefix) || len(acct.objs) != 0 {
		t.Errorf("counting off: counters %v, rules:\n%s", acct.objs, saved)
	}
	if got, err := p.Counts(); err != nil || len(got) != 0 {
		t.Errorf("counting off: Counts %v %v", got, err)
	}
}
