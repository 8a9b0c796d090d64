package ebpf

import (
	"net/netip"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

func memMaps(maxSlots int) *maps {
	return &maps{services: NewMemMap(svcKeySize, svcValSize, 64), slots: NewMemMap(slotKeySize, backendSize, maxSlots)}
}

func port(vip string, weights map[string]float64) dataplane.ServicePort {
	sp := dataplane.ServicePort{
		Name: dataplane.ServicePortName{Namespace: "ns", Name: vip, Port: "tcp"},
		VIP:  dataplane.VIP{IP: netip.MustParseAddr(vip), Port: 80, Protocol: dataplane.TCP},
	}
	for ip, w := range weights {
		sp.Backends = append(sp.Backends, dataplane.Backend{IP: netip.MustParseAddr(ip), Port: 8080, Weight: w, Ready: true})
	}
	return sp
}

// counts returns the live slots per backend of vip (an independent read
// of the maps: entry, then each slot).
func counts(t *testing.T, m *maps, vip string) map[string]int {
	t.Helper()
	live, _, _, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	tab, ok := live[svcKey{Addr: netip.MustParseAddr(vip), Port: 80, Proto: protoTCP}]
	if !ok {
		return nil
	}
	out := map[string]int{}
	for _, s := range tab.slots {
		out[s.Addr.String()]++
	}
	return out
}

func TestSyncTables(t *testing.T) {
	m := memMaps(1 << 16)
	s := dataplane.State{Services: []dataplane.ServicePort{
		port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90}),
		port("198.18.0.11", map[string]float64{"198.19.2.2": 1, "198.19.2.3": 0}),
	}}
	if _, err := syncTables(m, desiredTables(s), 4, nil); err != nil {
		t.Fatal(err)
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 9 {
		t.Errorf("10/90: slots %v, want 1 and 9", got)
	}
	if got := counts(t, m, "198.18.0.11"); len(got) != 1 || got["198.19.2.2"] != 1 {
		t.Errorf("1/0: slots %v, want the weight-0 backend left out", got)
	}
	// Unchanged: nothing written.
	if n, err := syncTables(m, desiredTables(s), 4, nil); err != nil || n != 0 {
		t.Errorf("second sync changed %d ports (%v), want 0", n, err)
	}
	// A change: a new table, the old one gone; a removed port: gone.
	s.Services = []dataplane.ServicePort{port("198.18.0.10", map[string]float64{"198.19.1.2": 1, "198.19.1.3": 1})}
	if n, err := syncTables(m, desiredTables(s), 4, nil); err != nil || n != 2 {
		t.Errorf("changed %d ports (%v), want 2", n, err)
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 1 {
		t.Errorf("1/1: slots %v", got)
	}
	if got := counts(t, m, "198.18.0.11"); got != nil {
		t.Errorf("removed port still has slots %v", got)
	}
	if n := m.slots.(*MemMap).Len(); n != 2 {
		t.Errorf("%d slot entries, want 2 (old tables deleted)", n)
	}
	// The other family's entries are not this Sync's to remove.
	v6 := dataplane.State{Services: []dataplane.ServicePort{port("2001:2::10", map[string]float64{"2001:2::1:2": 1})}}
	if _, err := syncTables(m, desiredTables(v6), 6, nil); err != nil {
		t.Fatal(err)
	}
	if got := counts(t, m, "198.18.0.10"); len(got) != 2 {
		t.Errorf("the IPv6 sync touched IPv4: %v", got)
	}
}

// TestSyncTablesFull: a table that does not fit leaves the port on its
// old, complete table, and the half-written one is removed.
func TestSyncTablesFull(t *testing.T) {
	m := memMaps(12)
	s := dataplane.State{Services: []dataplane.ServicePort{port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})}}
	if _, err := syncTables(m, desiredTables(s), 4, nil); err != nil {
		t.Fatal(err)
	}
	s.Services = []dataplane.ServicePort{port("198.18.0.10", map[string]float64{"198.19.1.2": 1, "198.19.1.3": 2, "198.19.1.4": 3})}
	if _, err := syncTables(m, desiredTables(s), 4, nil); err == nil {
		t.Fatal("a table larger than the map was accepted")
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 9 || len(got) != 2 {
		t.Errorf("after a failed sync: slots %v, want the old 1/9 table whole", got)
	}
	if n := m.slots.(*MemMap).Len(); n != 10 {
		t.Errorf("%d slot entries, want the old table's 10", n)
	}
}

// TestSocketServed: the ports the socket programs leave to nftables;
// ClientIP affinity is served at the socket.
func TestSocketServed(t *testing.T) {
	base := port("198.18.0.10", map[string]float64{"198.19.1.2": 1})
	aff, rej, none, sctp := base, base, base, base
	aff.AffinitySeconds = 10
	rej.RejectWeight = 1
	none.Backends = nil
	sctp.VIP.Protocol = dataplane.SCTP
	for name, sp := range map[string]dataplane.ServicePort{"plain": base, "affinity": aff} {
		if !socketServed(&sp) {
			t.Errorf("%s: not served at the socket", name)
		}
	}
	for name, sp := range map[string]dataplane.ServicePort{"reject share": rej, "no backend": none, "SCTP": sctp} {
		if socketServed(&sp) {
			t.Errorf("%s: served at the socket, want nftables", name)
		}
	}
}

// members returns the members of vip's port (an independent read).
func members(t *testing.T, m *maps, vip string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	var k countKey
	var v member
	if err := m.members.Each(&k, &v, func() {
		if k.VIP.Addr.String() == vip {
			out[k.Backend.Addr.String()] = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAffinityTables: an affinity port's timeout is in its services entry
// and its backends with slots are members (weight 0 is not); an endpoint that leaves
// stops being one, a new timeout is a new table, and a port without
// affinity has no members.
func TestAffinityTables(t *testing.T) {
	d, m := countedDualStack(false)
	aff := port("198.18.0.26", map[string]float64{"198.19.24.2": 20, "198.19.24.3": 80, "198.19.24.4": 0})
	aff.AffinitySeconds = 2
	plain := port("198.18.0.10", map[string]float64{"198.19.1.2": 1})
	syncState(t, d, aff, plain)
	_, vals, _, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	key := svcKey{Addr: netip.MustParseAddr("198.18.0.26"), Port: 80, Proto: protoTCP}
	if v := vals[key]; v.Affinity != 2 || v.Count != 5 {
		t.Errorf("services entry %+v, want 5 slots and affinity 2 s", v)
	}
	if got := members(t, m, "198.18.0.26"); len(got) != 2 || got["198.19.24.4"] {
		t.Errorf("members %v, want 198.19.24.2 and .3 (weight 0 is not)", got)
	}
	if got := members(t, m, "198.18.0.10"); len(got) != 0 {
		t.Errorf("a port without affinity has members %v", got)
	}
	views, err := d.Explain()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range views {
		if v.VIP == "198.18.0.26" && v.Entry == dataplane.EntryClusterIP && v.AffinitySeconds != 2 {
			t.Errorf("explain: %+v, want affinity 2 s", v)
		}
	}

	// 198.19.24.2 leaves, .4 gets a weight, the timeout becomes 5 s.
	aff = port("198.18.0.26", map[string]float64{"198.19.24.3": 80, "198.19.24.4": 20})
	aff.AffinitySeconds = 5
	syncState(t, d, aff, plain)
	_, vals, _, _ = liveTables(m)
	if v := vals[key]; v.Affinity != 5 {
		t.Errorf("services entry %+v, want affinity 5 s", v)
	}
	if got := members(t, m, "198.18.0.26"); len(got) != 2 || got["198.19.24.2"] {
		t.Errorf("members %v, want 198.19.24.3 and .4 only", got)
	}
	// Affinity off: no members left.
	aff.AffinitySeconds = 0
	syncState(t, d, aff, plain)
	if n := m.members.(*MemMap).Len(); n != 0 {
		t.Errorf("%d members left after affinity went", n)
	}
}

// TestExplainInexactSplit: a split the table cannot hold exactly is
// explained from the slots, within the bound, and verify's Diff accepts
// it against the desired shares, but not a wrong table.
func TestExplainInexactSplit(t *testing.T) {
	m := memMaps(1 << 16)
	s := dataplane.State{Services: []dataplane.ServicePort{
		port("198.18.0.10", map[string]float64{"198.19.1.2": 100.0 / 3, "198.19.1.3": 200.0 / 3}),
	}}
	want := desiredTables(s)
	if _, err := syncTables(m, want, 4, nil); err != nil {
		t.Fatal(err)
	}
	live, _, _, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	expected := dataplane.Expected(s)
	views := mergeViews(dataplane.Expected(s), live, 4)
	if len(views) != 1 || views[0].ShareBound == 0 {
		t.Fatalf("views %+v, want one with a share bound", views)
	}
	if d := dataplane.Diff(expected, views); len(d) != 0 {
		t.Errorf("Diff of the inexact table: %v", d)
	}
	// A table 3 slots off (a fill bug) is reported: the last three slots
	// (198.19.1.3's) given to the first backend.
	for _, tab := range live {
		for i := len(tab.slots) - 3; i < len(tab.slots); i++ {
			tab.slots[i] = tab.slots[0]
		}
	}
	if d := dataplane.Diff(expected, mergeViews(dataplane.Expected(s), live, 4)); len(d) == 0 {
		t.Error("Diff accepts a table 3 slots off")
	}
}
