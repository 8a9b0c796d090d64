package ebpf

import (
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// TestSyncPartialWritesChangedVIPs checks the socket tables' Syncs on the
// reconcile engine: a partial Sync compares and writes the VIPs of the
// changed Services only, a full one compares every VIP with the maps and
// repairs what a hand took away.
func TestSyncPartialWritesChangedVIPs(t *testing.T) {
	nft := nftables.NewDualStack(knftables.NewFake(knftables.IPv4Family, nftables.TableName),
		knftables.NewFake(knftables.IPv6Family, nftables.TableName), nftables.Config{})
	d := NewDualStackMem(nft, false)
	m := d.Family(4).(*Proxier).k.m
	a := port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})
	b := port("198.18.0.11", map[string]float64{"198.19.2.2": 1})
	sync := func(req dataplane.SyncRequest, ports ...dataplane.ServicePort) dataplane.SyncResult {
		t.Helper()
		s := dataplane.State{Services: ports}
		s.Sort()
		res, err := d.Sync(s, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	changed := func(vips ...string) dataplane.SyncRequest {
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}}
		for _, v := range vips {
			req.Changed[dataplane.ServiceName{Namespace: "ns", Name: v}] = true
		}
		return req
	}
	if res := sync(dataplane.PartialSync, a, b); !res.Full {
		t.Error("first sync: not full")
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 9 {
		t.Fatalf("10/90: slots %v", got)
	}
	// By hand: b's entry goes. a changes; a partial Sync writes a only.
	bKey := svcKey{Addr: netip.MustParseAddr("198.18.0.11"), Port: 80, Proto: protoTCP}
	if err := m.services.Delete(bKey); err != nil {
		t.Fatal(err)
	}
	a2 := port("198.18.0.10", map[string]float64{"198.19.1.2": 1, "198.19.1.3": 1})
	if res := sync(changed("198.18.0.10"), a2, b); res.Full {
		t.Error("a partial sync went full")
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 1 {
		t.Errorf("1/1: slots %v", got)
	}
	if got := counts(t, m, "198.18.0.11"); got != nil {
		t.Errorf("a partial sync of a looked at b: %v", got)
	}
	// A full Sync compares every VIP: b is back.
	if res := sync(dataplane.FullSync, a2, b); !res.Full {
		t.Error("full sync: not full")
	}
	if got := counts(t, m, "198.18.0.11"); got["198.19.2.2"] != 1 {
		t.Errorf("b after the full sync: %v", got)
	}
	// a goes: its entry and table go, b stays.
	sync(changed("198.18.0.10"), b)
	if got := counts(t, m, "198.18.0.10"); got != nil {
		t.Errorf("removed a: %v", got)
	}
	if got := counts(t, m, "198.18.0.11"); got["198.19.2.2"] != 1 {
		t.Errorf("b after a left: %v", got)
	}
	live, _, ids, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 1 || len(ids) != 1 {
		t.Errorf("%d entries and %d tables left, want 1 and 1", len(live), len(ids))
	}
}
