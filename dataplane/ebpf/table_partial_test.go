package ebpf

import (
	"encoding"
	"net/netip"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// countingMap counts whole-map reads (Each) of the map it wraps.
type countingMap struct {
	*MemMap
	eaches int
}

func (c *countingMap) Each(k, v encoding.BinaryUnmarshaler, fn func()) error {
	c.eaches++
	return c.MemMap.Each(k, v, fn)
}

// A partial sync after a full one reads the changed keys only (no walk of
// the services or slots map), writes the changed table under an ID no
// other table holds, and leaves the other ports' tables as they were.
func TestSyncTablesPartialReadsByKey(t *testing.T) {
	svcs := &countingMap{MemMap: NewMemMap(svcKeySize, svcValSize, 64)}
	slots := &countingMap{MemMap: NewMemMap(slotKeySize, backendSize, 1<<16)}
	m := &maps{services: svcs, slots: slots}
	a := port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})
	b := port("198.18.0.11", map[string]float64{"198.19.2.2": 1, "198.19.2.3": 1})
	c := port("198.18.0.12", map[string]float64{"198.19.3.2": 1})
	full := dataplane.State{Services: []dataplane.ServicePort{a, b, c}}
	if _, err := syncTables(m, desiredTables(full), 4, nil); err != nil {
		t.Fatal(err)
	}
	before := counts(t, m, "198.18.0.11")
	svcs.eaches, slots.eaches = 0, 0

	// b's weights change; c goes.
	b2 := port("198.18.0.11", map[string]float64{"198.19.2.2": 1, "198.19.2.3": 3})
	keyB := svcKey{Addr: netip.MustParseAddr("198.18.0.11"), Port: 80, Proto: protoTCP}
	keyC := svcKey{Addr: netip.MustParseAddr("198.18.0.12"), Port: 80, Proto: protoTCP}
	want := desiredTables(dataplane.State{Services: []dataplane.ServicePort{b2}})
	n, err := syncTables(m, want, 4, map[svcKey]bool{keyB: true, keyC: true})
	if err != nil {
		t.Fatal(err)
	}
	if svcs.eaches != 0 || slots.eaches != 0 {
		t.Errorf("partial sync walked the maps: services %d, slots %d times", svcs.eaches, slots.eaches)
	}
	if n != 2 {
		t.Errorf("changed %d ports, want 2 (b rewritten, c deleted)", n)
	}
	if got := counts(t, m, "198.18.0.11"); got["198.19.2.2"] != 1 || got["198.19.2.3"] != 3 {
		t.Errorf("b after the partial sync: %v (before %v), want 1 and 3", got, before)
	}
	if got := counts(t, m, "198.18.0.12"); got != nil {
		t.Errorf("c still has a table: %v", got)
	}
	if got := counts(t, m, "198.18.0.10"); got["198.19.1.2"] != 1 || got["198.19.1.3"] != 9 {
		t.Errorf("a, not in the partial sync, changed: %v", got)
	}
	// Every services entry names its own table, and no slot is left
	// outside them (the old tables of b and c were deleted).
	live, vals, ids, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	total := 0
	for key, v := range vals {
		if seen[v.ID] {
			t.Errorf("%s shares table %d", key.String(), v.ID)
		}
		seen[v.ID] = true
		total += len(live[key].slots)
	}
	slotCount := 0
	for id, s := range ids {
		if !seen[id] {
			t.Errorf("table %d (%d slots) is named by no entry", id, len(s))
		}
		slotCount += len(s)
	}
	if slotCount != total {
		t.Errorf("%d slots in the map, %d named", slotCount, total)
	}
}
