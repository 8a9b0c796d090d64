package ebpf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/steelyard-net/steelyard/dataplane"
)

// table is one Service port's entry as the socket programs see it: the
// VIP and its slots, each naming a backend.
type table struct {
	key   svcKey
	slots []backendVal
	// name is the Service port's, shortened as the nftables comments
	// (the names map; tables read back from the kernel have none).
	name string
	// affinity is the ClientIP timeout in seconds (0: none), and members
	// the backends an affinity entry may keep a client on: those with
	// slots (desired tables only).
	affinity uint32
	members  []backendVal
}

// socketServed reports whether the socket programs choose the backends of
// sp's clusterIP (for TCP connects and unconnected UDP sends; connected
// UDP sockets go through nftables, see bpf/socklb.c), sessionAffinity
// ClientIP included. The others go through the maps untouched and the
// nftables rules (which carry every clusterIP as well) serve them: a
// reject share (Gateway API invalid backendRefs), no backend for internal
// traffic (rejected or dropped by nftables), SCTP.
func socketServed(sp *dataplane.ServicePort) bool {
	_, ok := svcKeyOf(sp.VIP)
	return ok && sp.RejectWeight == 0 && len(sp.InternalBackends()) > 0
}

// desiredTables returns the tables of the Service ports of s that the
// socket programs serve.
func desiredTables(s dataplane.State) map[svcKey]table {
	out := map[svcKey]table{}
	for i := range s.Services {
		if sp := &s.Services[i]; socketServed(sp) {
			t := tableOf(sp)
			out[t.key] = t
		}
	}
	return out
}

// tableOf returns the table of a Service port the socket programs serve.
func tableOf(sp *dataplane.ServicePort) table {
	key, _ := svcKeyOf(sp.VIP)
	bs := sp.InternalBackends()
	weights := make([]float64, len(bs))
	for j, b := range bs {
		weights[j] = b.Weight
	}
	counts, n := Fill(weights)
	t := table{key: key, slots: make([]backendVal, 0, n), name: dataplane.ShortName(sp.Name.String(), nameSize)}
	for j, b := range bs {
		for range counts[j] {
			t.slots = append(t.slots, backendVal{Addr: b.IP, Port: b.Port})
		}
	}
	if sp.AffinitySeconds > 0 {
		t.affinity = uint32(sp.AffinitySeconds)
		for _, b := range bs {
			t.members = append(t.members, backendVal{Addr: b.IP, Port: b.Port})
		}
	}
	return t
}

// liveTables reads the services and slots maps back. A services entry
// whose table has a missing slot comes back with that slot invalid.
func liveTables(m *maps) (map[svcKey]table, map[svcKey]svcVal, map[uint32][]uint32, error) {
	vals := map[svcKey]svcVal{}
	var k svcKey
	var v svcVal
	if err := m.services.Each(&k, &v, func() { vals[k] = v }); err != nil {
		return nil, nil, nil, fmt.Errorf("read services: %w", err)
	}
	byID := map[uint32]map[uint32]backendVal{}
	ids := map[uint32][]uint32{} // every table in the slots map, with its slots
	var sk slotKey
	var b backendVal
	err := m.slots.Each(&sk, &b, func() {
		if byID[sk.ID] == nil {
			byID[sk.ID] = map[uint32]backendVal{}
		}
		byID[sk.ID][sk.Slot] = b
		ids[sk.ID] = append(ids[sk.ID], sk.Slot)
	})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read slots: %w", err)
	}
	out := map[svcKey]table{}
	for key, v := range vals {
		t := table{key: key, slots: make([]backendVal, v.Count), affinity: v.Affinity}
		for i := range t.slots {
			t.slots[i] = byID[v.ID][uint32(i)]
		}
		out[key] = t
	}
	return out, vals, ids, nil
}

// tableIDs are the slot table IDs in use (maps.ids): a partial sync takes
// a fresh one from here instead of reading the whole slots map back, which
// at 30,000 Services is 300,000 entries per change.
type tableIDs struct {
	used map[uint32]bool
	next uint32
}

// fresh returns an unused ID and marks it used.
func (t *tableIDs) fresh() uint32 {
	if t.next == 0 {
		t.next = 1
	}
	for t.used[t.next] {
		t.next++
	}
	t.used[t.next] = true
	return t.next
}

// free marks id unused (its slots are deleted). It is not handed out
// again before the next full sync starts the count over: a connect() that
// read the old ID just before the switch must not find another port's
// table under it.
func (t *tableIDs) free(id uint32) { delete(t.used, id) }

// syncTables makes the maps hold want for the IP family. Each changed port gets its table
// written under a fresh ID first and then switches to it with one update
// of its services entry, so a connect() sees the old table or the new,
// never a mix; then the old table is deleted. A failure leaves every
// port on a complete table (the old or the new one).
//
// only, when not nil, limits the sync to those keys (a partial Sync: the
// VIPs of the Service ports it writes; want has no others): the entries of
// other keys are neither compared nor deleted, and only those keys' entries
// and tables are read (by key, once a full sync has recorded the IDs in
// use), so a partial sync costs what it changes, not the cluster's size.
func syncTables(m *maps, want map[svcKey]table, family int, only map[svcKey]bool) (changed int, err error) {
	var live map[svcKey]table
	var vals map[svcKey]svcVal
	var ids map[uint32][]uint32
	partial := only != nil && m.ids != nil
	if partial {
		live, vals, ids, err = someTables(m, only)
	} else {
		live, vals, ids, err = liveTables(m)
	}
	if err != nil {
		m.ids = nil
		return 0, err
	}
	if !partial {
		m.ids = &tableIDs{used: map[uint32]bool{}}
		for id := range ids {
			m.ids.used[id] = true
		}
		for _, v := range vals {
			m.ids.used[v.ID] = true
		}
	}
	for key := range vals {
		if familyOf(key.Addr) != family {
			// The other family's Sync owns it.
			delete(vals, key)
			delete(live, key)
		}
	}
	var errs []error
	for key, t := range want {
		if l, ok := live[key]; ok && slices.Equal(l.slots, t.slots) && l.affinity == t.affinity {
			continue
		}
		id := m.ids.fresh()
		if err := writeTable(m, id, t.slots); err != nil {
			deleteTable(m, id, len(t.slots))
			m.ids.free(id)
			errs = append(errs, fmt.Errorf("%s: %w", key.String(), err))
			continue
		}
		if err := m.services.Put(key, svcVal{ID: id, Count: uint32(len(t.slots)), Affinity: t.affinity}); err != nil {
			deleteTable(m, id, len(t.slots))
			m.ids.free(id)
			errs = append(errs, fmt.Errorf("%s: %w", key.String(), err))
			continue
		}
		changed++
		if old, ok := vals[key]; ok {
			deleteSlots(m, old.ID, ids[old.ID])
			delete(ids, old.ID)
			m.ids.free(old.ID)
		}
	}
	for key, v := range vals {
		if _, ok := want[key]; ok || only != nil && !only[key] {
			continue
		}
		if err := m.services.Delete(key); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", key.String(), err))
			continue
		}
		changed++
		deleteSlots(m, v.ID, ids[v.ID])
		delete(ids, v.ID)
		m.ids.free(v.ID)
	}
	if partial {
		if len(errs) > 0 {
			// The next Sync is full (the engine's rule after an error)
			// and reads the IDs back.
			m.ids = nil
		}
		return changed, errors.Join(errs...)
	}
	// Tables no entry names any more (a crash between writing one and
	// switching to it).
	referenced := map[uint32]bool{}
	var k svcKey
	var v svcVal
	if err := m.services.Each(&k, &v, func() { referenced[v.ID] = true }); err != nil {
		errs = append(errs, fmt.Errorf("read services: %w", err))
	} else {
		for id, slots := range ids {
			if !referenced[id] {
				deleteSlots(m, id, slots)
				m.ids.free(id)
			}
		}
	}
	if len(errs) > 0 {
		m.ids = nil
	}
	return changed, errors.Join(errs...)
}

// someTables reads the services entries of keys and their tables by key
// (liveTables' result for those keys only).
func someTables(m *maps, keys map[svcKey]bool) (map[svcKey]table, map[svcKey]svcVal, map[uint32][]uint32, error) {
	out := map[svcKey]table{}
	vals := map[svcKey]svcVal{}
	ids := map[uint32][]uint32{}
	for key := range keys {
		var v svcVal
		ok, err := m.services.Lookup(key, &v)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("read services %s: %w", key.String(), err)
		}
		if !ok {
			continue
		}
		vals[key] = v
		t := table{key: key, slots: make([]backendVal, v.Count), affinity: v.Affinity}
		for i := range t.slots {
			// A missing slot stays invalid (zero), as in liveTables.
			found, err := m.slots.Lookup(slotKey{ID: v.ID, Slot: uint32(i)}, &t.slots[i])
			if err != nil {
				return nil, nil, nil, fmt.Errorf("read slots of %s: %w", key.String(), err)
			}
			if found {
				ids[v.ID] = append(ids[v.ID], uint32(i))
			}
		}
		out[key] = t
	}
	return out, vals, ids, nil
}

func writeTable(m *maps, id uint32, slots []backendVal) error {
	for i := range slots {
		if err := m.slots.Put(slotKey{ID: id, Slot: uint32(i)}, slots[i]); err != nil {
			return fmt.Errorf("slot %d: %w", i, err)
		}
	}
	return nil
}

func deleteTable(m *maps, id uint32, n int) {
	slots := make([]uint32, n)
	for i := range slots {
		slots[i] = uint32(i)
	}
	deleteSlots(m, id, slots)
}

func deleteSlots(m *maps, id uint32, slots []uint32) {
	for _, s := range slots {
		_ = m.slots.Delete(slotKey{ID: id, Slot: s})
	}
}

// String renders the key like a VIP.
func (k svcKey) String() string {
	return dataplane.VIP{IP: k.Addr, Port: k.Port, Protocol: k.protocol()}.String()
}
