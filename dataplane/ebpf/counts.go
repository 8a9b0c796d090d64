package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/cilium/ebpf"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Counting new connections per endpoint (issue 23), --count-connections.
// The socket programs add one to the counts entry of (VIP, backend) each
// time they choose a backend: a TCP connect() or an unconnected UDP
// sendmsg() (so UDP is counted per datagram here, per flow where nftables
// chooses). The agent creates the entries (zero) before a table names the
// backend, and deletes those of backends a VIP no longer has after the
// table stopped naming them, so the programs never allocate and the map
// holds only live endpoints. A weight change or another endpoint coming or
// going keeps the counts of the endpoints that stay; so does a restart of
// the agent (the map is pinned). The counts of the nftables half (node
// ports, sockets outside the cgroup, connected UDP) are added to them per
// endpoint by Counts.

// counterMap is the counts map: per-CPU counters the agent creates and
// deletes and the programs add to.
type counterMap interface {
	// Create adds a counter of zero unless key has one.
	Create(key countKey) error
	Delete(key countKey) error
	// Each calls fn with every counter, summed over the CPUs.
	Each(fn func(key countKey, n uint64)) error
	Close() error
}

// kernelCounters is the pinned or loaded per-CPU counts map.
type kernelCounters struct{ m *ebpf.Map }

func (k kernelCounters) Create(key countKey) error {
	// A per-CPU map's value is one per possible CPU.
	zero := make([]uint64, ebpf.MustPossibleCPU())
	err := retryNoMem(func() error { return k.m.Update(key, zero, ebpf.UpdateNoExist) })
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return err
	}
	return nil
}

func (k kernelCounters) Delete(key countKey) error {
	if err := k.m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

func (k kernelCounters) Each(fn func(countKey, uint64)) error {
	var key countKey
	var perCPU []uint64
	it := k.m.Iterate()
	for it.Next(&key, &perCPU) {
		fn(key, sumCPUs(perCPU))
	}
	return it.Err()
}

func (k kernelCounters) Close() error { return k.m.Close() }

// sumCPUs adds the CPUs' values of one counter.
func sumCPUs(perCPU []uint64) uint64 {
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// MemCounters is a per-CPU counts map in memory (for tests): entries keyed
// by the encoded key, one value per CPU, bumped by Add as the programs do.
type MemCounters struct {
	CPUs, MaxEntries int
	entries          map[string][]uint64
}

// NewMemCounters returns an empty MemCounters.
func NewMemCounters(cpus, maxEntries int) *MemCounters {
	return &MemCounters{CPUs: cpus, MaxEntries: maxEntries, entries: map[string][]uint64{}}
}

// Create implements counterMap.
func (m *MemCounters) Create(key countKey) error {
	b, err := key.MarshalBinary()
	if err != nil {
		return err
	}
	if _, ok := m.entries[string(b)]; ok {
		return nil
	}
	if len(m.entries) >= m.MaxEntries {
		return errors.New("memcounters: map full (E2BIG)")
	}
	m.entries[string(b)] = make([]uint64, m.CPUs)
	return nil
}

// Delete implements counterMap.
func (m *MemCounters) Delete(key countKey) error {
	b, err := key.MarshalBinary()
	if err != nil {
		return err
	}
	delete(m.entries, string(b))
	return nil
}

// Each implements counterMap, in key order.
func (m *MemCounters) Each(fn func(countKey, uint64)) error {
	keys := make([]string, 0, len(m.entries))
	for k := range m.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var key countKey
		if err := key.UnmarshalBinary([]byte(k)); err != nil {
			return err
		}
		fn(key, sumCPUs(m.entries[k]))
	}
	return nil
}

// Add adds n on cpu to key's counter, as a program does; false when key
// has none (the program then counts nothing).
func (m *MemCounters) Add(key countKey, cpu int, n uint64) bool {
	b, err := key.MarshalBinary()
	if err != nil {
		return false
	}
	v, ok := m.entries[string(b)]
	if ok {
		v[cpu%m.CPUs] += n
	}
	return ok
}

// Close implements counterMap.
func (m *MemCounters) Close() error { return nil }

// Len returns the number of counters.
func (m *MemCounters) Len() int { return len(m.entries) }

// wantCounts returns the counters and names the tables of want need: one
// counter per VIP and backend named by a slot.
func wantCounts(want map[svcKey]table) (map[countKey]bool, map[svcKey]nameVal) {
	keys := map[countKey]bool{}
	names := make(map[svcKey]nameVal, len(want))
	for vip, t := range want {
		names[vip] = nameVal(t.name)
		for _, b := range t.slots {
			keys[countKey{VIP: vip, Backend: b}] = true
		}
	}
	return keys, names
}

// countSync is what one Sync does to the counts and names maps of a
// family, in two steps around the tables' sync: create before (a table
// never names a backend without a counter), prune after (no table names
// what is deleted any more).
type countSync struct {
	m      *maps
	family int
	keys   map[countKey]bool
	names  map[svcKey]nameVal
	live   map[countKey]bool
	lnames map[svcKey]nameVal
}

// prepareCounts creates the counters and names want needs (none when
// counting is off) and returns the step that prunes the rest; only, when
// not nil, limits both to those VIPs (syncTables). old, when not nil (a
// partial Sync after a successful one), is what the last Sync wanted for
// those VIPs: the counters and names it made are taken from it instead of
// a walk of both maps, which at 30,000 Services x 10 is 300,000 counters
// per change. A counter neither table names (left by a failed Sync) waits
// for the next full Sync.
func prepareCounts(m *maps, want map[svcKey]table, family int, counting bool, only map[svcKey]bool, old map[svcKey]table) (*countSync, error) {
	c := &countSync{m: m, family: family, keys: map[countKey]bool{}, names: map[svcKey]nameVal{},
		live: map[countKey]bool{}, lnames: map[svcKey]nameVal{}}
	if m.counts == nil || m.names == nil {
		return c, nil // pins of a version with no counts: nothing to do
	}
	if counting {
		c.keys, c.names = wantCounts(want)
	}
	if only != nil && old != nil {
		if counting {
			c.live, c.lnames = wantCounts(old)
		}
		return c, c.create()
	}
	if err := m.counts.Each(func(k countKey, _ uint64) {
		if familyOf(k.VIP.Addr) == family && (only == nil || only[k.VIP]) {
			c.live[k] = true
		}
	}); err != nil {
		return nil, fmt.Errorf("read counts: %w", err)
	}
	var k svcKey
	var n nameVal
	if err := m.names.Each(&k, &n, func() {
		if familyOf(k.Addr) == family && (only == nil || only[k]) {
			c.lnames[k] = n
		}
	}); err != nil {
		return nil, fmt.Errorf("read names: %w", err)
	}
	return c, c.create()
}

// create writes the names and counters wanted that are not live.
func (c *countSync) create() error {
	var errs []error
	for k, n := range c.names {
		if c.lnames[k] == n {
			continue
		}
		if err := c.m.names.Put(k, n); err != nil {
			errs = append(errs, fmt.Errorf("name of %s: %w", k, err))
		}
	}
	for k := range c.keys {
		if c.live[k] {
			continue
		}
		if err := c.m.counts.Create(k); err != nil {
			errs = append(errs, fmt.Errorf("counter of %s -> %s: %w", k.VIP, k.Backend.addrPort(), err))
		}
	}
	return errors.Join(errs...)
}

// prune deletes the counters and names the last prepareCounts did not want.
func (c *countSync) prune() error {
	if c.m.counts == nil || c.m.names == nil {
		return nil
	}
	var errs []error
	for k := range c.live {
		if !c.keys[k] {
			errs = append(errs, c.m.counts.Delete(k))
		}
	}
	for k := range c.lnames {
		if _, ok := c.names[k]; !ok {
			errs = append(errs, c.m.names.Delete(k))
		}
	}
	return errors.Join(errs...)
}

// socketCounts reads the counts of the family's VIPs, labelled with their
// Service port's name. A counter whose VIP has no name (written by hand,
// or between two steps of a sync) is left out: it cannot be labelled.
func socketCounts(m *maps, family int) ([]dataplane.EndpointCount, error) {
	if m.counts == nil || m.names == nil {
		return nil, nil
	}
	names := map[svcKey]nameVal{}
	var k svcKey
	var n nameVal
	if err := m.names.Each(&k, &n, func() { names[k] = n }); err != nil {
		return nil, fmt.Errorf("read names: %w", err)
	}
	var out []dataplane.EndpointCount
	err := m.counts.Each(func(key countKey, c uint64) {
		name, ok := names[key.VIP]
		if !ok || familyOf(key.VIP.Addr) != family {
			return
		}
		out = append(out, dataplane.EndpointCount{Service: string(name), Protocol: key.VIP.protocol(),
			Endpoint: netip.AddrPortFrom(key.Backend.Addr, key.Backend.Port), NewConnections: c})
	})
	if err != nil {
		return nil, fmt.Errorf("read counts: %w", err)
	}
	return out, nil
}
