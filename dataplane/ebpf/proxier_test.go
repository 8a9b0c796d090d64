package ebpf

import (
	"context"
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

// watchNFT calls before ahead of each nftables transaction it runs.
type watchNFT struct {
	knftables.Interface
	before func()
}

func (w watchNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	w.before()
	return w.Interface.Run(ctx, tx)
}

// TestSyncWritesMapsFirst: the socket tables of a change are in the maps
// when the nftables half's transaction runs (the maps do not wait for it,
// issue 22), in the first Sync and in a partial one; a port that goes is
// out of the maps by then too.
func TestSyncWritesMapsFirst(t *testing.T) {
	var m *maps
	var check func()
	before := func() {
		if check != nil {
			check()
		}
	}
	nft := nftables.NewDualStack(watchNFT{knftables.NewFake(knftables.IPv4Family, nftables.TableName), before},
		watchNFT{knftables.NewFake(knftables.IPv6Family, nftables.TableName), func() {}}, nftables.Config{})
	d := NewDualStackMem(nft, false)
	m = d.Family(4).(*Proxier).k.m
	a := port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})
	b := port("198.18.0.11", map[string]float64{"198.19.2.2": 1})
	runs := 0
	check = func() {
		runs++
		if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 9 {
			t.Errorf("first sync: a's table when nftables ran: %v", got)
		}
	}
	if _, err := d.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	a2 := port("198.18.0.10", map[string]float64{"198.19.1.4": 1, "198.19.1.3": 1})
	check = func() {
		runs++
		if got := counts(t, m, "198.18.0.10"); got["198.19.1.4"] != 1 || got["198.19.1.3"] != 1 || len(got) != 2 {
			t.Errorf("partial sync: a's table when nftables ran: %v", got)
		}
		if got := counts(t, m, "198.18.0.11"); got != nil {
			t.Errorf("partial sync: b still in the maps when nftables ran: %v", got)
		}
	}
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{a.Name.Service(): true, b.Name.Service(): true}}
	if _, err := d.Sync(dataplane.State{Services: []dataplane.ServicePort{a2}}, req); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Errorf("%d nftables transactions checked, want 2", runs)
	}
}

// TestSyncPartialIndexFollowsVIPs: partial Syncs find the recorded ports
// of a VIP through the Proxier's index, which follows a port that moves
// to another VIP, and two ports of one VIP (the last by name wins) stay
// decided the way a full Sync decides them.
func TestSyncPartialIndexFollowsVIPs(t *testing.T) {
	nft := nftables.NewDualStack(knftables.NewFake(knftables.IPv4Family, nftables.TableName),
		knftables.NewFake(knftables.IPv6Family, nftables.TableName), nftables.Config{})
	d := NewDualStackMem(nft, false)
	m := d.Family(4).(*Proxier).k.m
	named := func(name, vip string, backend string) dataplane.ServicePort {
		sp := port(vip, map[string]float64{backend: 1})
		sp.Name.Name = name
		return sp
	}
	sync := func(full bool, changed []string, ports ...dataplane.ServicePort) {
		t.Helper()
		s := dataplane.State{Services: ports}
		s.Sort()
		req := dataplane.SyncRequest{Full: full, Changed: map[dataplane.ServiceName]bool{}}
		for _, n := range changed {
			req.Changed[dataplane.ServiceName{Namespace: "ns", Name: n}] = true
		}
		if _, err := d.Sync(s, req); err != nil {
			t.Fatal(err)
		}
	}
	only := func(vip, backend string) {
		t.Helper()
		if got := counts(t, m, vip); len(got) != 1 || got[backend] != 1 {
			t.Errorf("%s: slots %v, want %s only", vip, got, backend)
		}
	}
	a := named("a", "198.18.0.10", "198.19.1.1")
	z := named("z", "198.18.0.20", "198.19.9.9")
	sync(true, nil, a, z)
	// a moves to 198.18.0.11: the old VIP goes, the new one comes.
	a = named("a", "198.18.0.11", "198.19.1.2")
	sync(false, []string{"a"}, a, z)
	only("198.18.0.11", "198.19.1.2")
	if got := counts(t, m, "198.18.0.10"); got != nil {
		t.Errorf("a's old VIP kept a table: %v", got)
	}
	// z moves onto a's VIP: z is last by name, so its table wins, and a
	// change of a alone leaves it so.
	z = named("z", "198.18.0.11", "198.19.9.9")
	sync(false, []string{"z"}, a, z)
	only("198.18.0.11", "198.19.9.9")
	a = named("a", "198.18.0.11", "198.19.1.3")
	sync(false, []string{"a"}, a, z)
	only("198.18.0.11", "198.19.9.9")
	// z goes: a's table is written.
	sync(false, []string{"z"}, a)
	only("198.18.0.11", "198.19.1.3")
	if got := counts(t, m, "198.18.0.20"); got != nil {
		t.Errorf("z's first VIP kept a table: %v", got)
	}
}
