package nftables

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// sameShard returns two Service ports (VIPs 198.18.0.x) whose cluster
// splits draw from the same shared weight map, and that map.
func sameShard(t *testing.T, p *Proxier) (dataplane.ServicePort, dataplane.ServicePort, string) {
	t.Helper()
	seen := map[string]dataplane.ServicePort{}
	for i := 0; i < 250; i++ {
		sp := svcPort(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.0.%d", i+1), 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3))
		o := p.renderPort(&sp)
		for m := range o.maps {
			if other, ok := seen[m]; ok {
				return other, sp, m
			}
			seen[m] = sp
		}
	}
	t.Fatal("no two ports of 250 share a weight map")
	return dataplane.ServicePort{}, dataplane.ServicePort{}, ""
}

// elemsOf are the elements of map m in the fake.
func elemsOf(t *testing.T, nft knftables.Interface, m string) []string {
	t.Helper()
	fm := fakeOf(nft).Table.Maps[m]
	if fm == nil {
		t.Fatalf("no map %s", m)
	}
	var out []string
	for _, e := range fm.Elements {
		out = append(out, strings.Join(e.Key, " . ")+" : "+strings.Join(e.Value, " . "))
	}
	return out
}

// TestSharedWeightMap: two ports sharing a weight map keep their own
// draws through a change of one (only its elements replaced), its removal
// (its elements deleted, the map kept for the other) and a restart whose
// slots differ from the table's (the full sync writes the map again, no
// element left over). The tracer judges the shares.
func TestSharedWeightMap(t *testing.T) {
	p, nft := newTest(t, 4)
	a, b, m := sameShard(t, p)
	sync := func(what string, p *Proxier, req dataplane.SyncRequest, sps ...dataplane.ServicePort) {
		t.Helper()
		st := dataplane.State{Services: sps}
		if _, err := p.Sync(st, req); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		wantServed(t, what, p, st)
	}
	sync("both", p, dataplane.FullSync, a, b)
	if n := len(elemsOf(t, nft, m)); n != 4 {
		t.Fatalf("map %s has %d elements, want 4: %q", m, n, elemsOf(t, nft, m))
	}
	a2 := a
	a2.Backends = []dataplane.Backend{be("198.19.1.2", 8080, 1), be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 2)}
	sync("a changed", p, dataplane.PartialSync, a2, b)
	if p.lastOps > 8 {
		t.Errorf("a's change took %d operations, want its elements only", p.lastOps)
	}
	if n := len(elemsOf(t, nft, m)); n != 5 {
		t.Errorf("after a's change map %s has %d elements, want 5: %q", m, n, elemsOf(t, nft, m))
	}
	sync("a removed", p, dataplane.PartialSync, b)
	if n := len(elemsOf(t, nft, m)); n != 2 {
		t.Errorf("after a's removal map %s has %d elements, want b's 2: %q", m, n, elemsOf(t, nft, m))
	}
	sync("a back", p, dataplane.PartialSync, a, b)

	// A restart: another Proxier whose slot for b is taken, so b draws
	// elsewhere in the map than the table says.
	p2 := NewProxier(nft, p.cfg)
	fakeLive(p2)
	bo := p.renderPort(&b)
	for _, k := range placesOf(bo) {
		slot := p.slots.of[k]
		p2.slots.used[k.m] = map[uint32]string{slot: "taken"}
	}
	sync("restart", p2, dataplane.FullSync, a, b)
	if n := len(elemsOf(t, nft, m)); n != 4 {
		t.Errorf("after the restart map %s has %d elements, want 4: %q", m, n, elemsOf(t, nft, m))
	}
	for _, k := range placesOf(p2.renderPort(&b)) {
		if p2.slots.of[k] == p.slots.of[k] {
			t.Errorf("b kept its slot %d: the test did not move it", p.slots.of[k])
		}
	}

	// Without a port the map waits StaleDelay, then goes (the slot the
	// test took is given back first).
	for m, used := range p2.slots.used {
		for slot, c := range used {
			if c == "taken" {
				delete(p2.slots.used[m], slot)
			}
		}
	}
	now := time.Now()
	p2.now = func() time.Time { return now }
	sync("none", p2, dataplane.PartialSync)
	if fakeOf(nft).Table.Maps[m] == nil {
		t.Errorf("map %s deleted at once", m)
	}
	now = now.Add(StaleDelay)
	sync("reaped", p2, dataplane.PartialSync)
	if fakeOf(nft).Table.Maps[m] != nil {
		t.Errorf("map %s still there after StaleDelay", m)
	}
	sync("a again", p2, dataplane.PartialSync, a)
}
