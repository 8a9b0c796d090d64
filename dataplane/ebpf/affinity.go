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
// the agent adds a port's members before its table can name them and
// removes those that left after the table stopped naming them, so an
// endpoint that left is never returned, while the clients of the
// endpoints that stay keep theirs through any change of the table.

// memberSync is one Sync's work on the members map of a family, in two
// steps around the tables' sync, as countSync.
type memberSync struct {
	m          *maps
	want, live map[countKey]bool
}

// prepareMembers adds the members the tables of want need and returns the
// step that removes the rest.
func prepareMembers(m *maps, want map[svcKey]table, family int) (*memberSync, error) {
	s := &memberSync{m: m, want: map[countKey]bool{}, live: map[countKey]bool{}}
	if m.members == nil {
		return s, nil // pins of a version without affinity at the socket
	}
	for vip, t := range want {
		for _, b := range t.members {
			s.want[countKey{VIP: vip, Backend: b}] = true
		}
	}
	var k countKey
	var v member
	if err := m.members.Each(&k, &v, func() {
		if familyOf(k.VIP.Addr) == family {
			s.live[k] = true
		}
	}); err != nil {
		return nil, fmt.Errorf("read members: %w", err)
	}
	var errs []error
	for k := range s.want {
		if s.live[k] {
			continue
		}
		if err := m.members.Put(k, member{}); err != nil {
			errs = append(errs, fmt.Errorf("member %s -> %s: %w", k.VIP, k.Backend.addrPort(), err))
		}
	}
	return s, errors.Join(errs...)
}

// prune removes the members prepareMembers did not want.
func (s *memberSync) prune() error {
	if s.m.members == nil {
		return nil
	}
	var errs []error
	for k := range s.live {
		if !s.want[k] {
			errs = append(errs, s.m.members.Delete(k))
		}
	}
	return errors.Join(errs...)
}
