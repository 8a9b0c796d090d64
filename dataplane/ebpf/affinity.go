package ebpf

import (
	"errors"
	"fmt"
)

// sessionAffinity ClientIP at the socket (bpf/socklb.c): the programs keep
// each client's backend in the affinity map (LRU, written by them only)
// with the time of its last use, and the Service's timeout in the
// services entry. An entry is used only while its backend is in the
// members map, which holds the backends of each affinity port that have
// slots (a weight of 0 drains affinity clients too, as in nftables mode):
// an endpoint that left is never returned, while the clients of the
// endpoints that stay keep theirs through any change of the table.
//
// The members are synced before the tables, adds and removals alike, so
// that a table that no longer names a backend is never live while an
// affinity entry may still return it. The window the other way round (a
// new table may still be the old one while its backend already left
// members) costs nothing: a client whose entry fails the check chooses
// again from the table, and an entry made from the old table fails at its
// next use.

// syncMembers makes the members map hold the backends with slots of the
// affinity ports of want, for the family; only, when not nil, limits it to
// those VIPs (syncTables). old, when not nil (a partial Sync after a
// successful one), is what the last Sync wanted for those VIPs: their live
// members are taken from it instead of a walk of the map.
func syncMembers(m *maps, want map[svcKey]table, family int, only map[svcKey]bool, old map[svcKey]table) error {
	if m.members == nil {
		return nil // pins of a version without affinity at the socket
	}
	wanted := membersOf(want)
	var live map[countKey]bool
	if only != nil && old != nil {
		live = membersOf(old)
	} else {
		live = map[countKey]bool{}
		var k countKey
		var v member
		if err := m.members.Each(&k, &v, func() {
			if familyOf(k.VIP.Addr) == family && (only == nil || only[k.VIP]) {
				live[k] = true
			}
		}); err != nil {
			return fmt.Errorf("read members: %w", err)
		}
	}
	var errs []error
	for k := range wanted {
		if live[k] {
			continue
		}
		if err := m.members.Put(k, member{}); err != nil {
			errs = append(errs, fmt.Errorf("member %s -> %s: %w", k.VIP, k.Backend.addrPort(), err))
		}
	}
	for k := range live {
		if !wanted[k] {
			errs = append(errs, m.members.Delete(k))
		}
	}
	return errors.Join(errs...)
}

// membersOf returns the members entries the tables name.
func membersOf(tables map[svcKey]table) map[countKey]bool {
	out := map[countKey]bool{}
	for vip, t := range tables {
		for _, b := range t.members {
			out[countKey{VIP: vip, Backend: b}] = true
		}
	}
	return out
}
