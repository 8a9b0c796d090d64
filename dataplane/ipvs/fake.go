package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Fake is a map-backed IPVS table that enforces what the kernel enforces:
// a virtual server is added once, destinations need their virtual server,
// a destination is added once, and only existing objects are updated or
// deleted. Tests set connection counters with SetConns and count writes.
type Fake struct {
	mu       sync.Mutex
	services map[dataplane.VIP]*fakeService
	// Writes counts every successful add, update and delete.
	Writes int
	// DestWrites counts the writes per destination ("vip -> ip:port"), so
	// tests can prove that unchanged destinations are never touched.
	DestWrites map[string]int
}

type fakeService struct {
	vs    VirtualServer
	dests map[netip.AddrPort]RealServer
}

var _ Interface = (*Fake)(nil)

// NewFake returns an empty table.
func NewFake() *Fake {
	return &Fake{services: map[dataplane.VIP]*fakeService{}, DestWrites: map[string]int{}}
}

func destKey(v VirtualServer, r RealServer) string {
	return v.Key().String() + " -> " + r.Addr().String()
}

// VirtualServers implements Interface.
func (f *Fake) VirtualServers() ([]VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]VirtualServer, 0, len(f.services))
	for _, s := range f.services {
		out = append(out, s.vs)
	}
	slices.SortFunc(out, func(a, b VirtualServer) int {
		if c := a.Address.Compare(b.Address); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return strings.Compare(string(a.Protocol), string(b.Protocol))
	})
	return out, nil
}

// AddVirtualServer implements Interface.
func (f *Fake) AddVirtualServer(v VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[v.Key()]; ok {
		return fmt.Errorf("add IPVS service %s: file exists", v.Key())
	}
	if !validScheduler(v.Scheduler) {
		return fmt.Errorf("add IPVS service %s: scheduler %q: no such file or directory", v.Key(), v.Scheduler)
	}
	f.services[v.Key()] = &fakeService{vs: v, dests: map[netip.AddrPort]RealServer{}}
	f.Writes++
	return nil
}

// UpdateVirtualServer implements Interface.
func (f *Fake) UpdateVirtualServer(v VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return fmt.Errorf("update IPVS service %s: no such process", v.Key())
	}
	if !validScheduler(v.Scheduler) {
		return fmt.Errorf("update IPVS service %s: scheduler %q: no such file or directory", v.Key(), v.Scheduler)
	}
	s.vs = v
	f.Writes++
	return nil
}

// DeleteVirtualServer implements Interface.
func (f *Fake) DeleteVirtualServer(v VirtualServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[v.Key()]; !ok {
		return fmt.Errorf("delete IPVS service %s: no such process", v.Key())
	}
	delete(f.services, v.Key())
	f.Writes++
	return nil
}

// RealServers implements Interface.
func (f *Fake) RealServers(v VirtualServer) ([]RealServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return nil, fmt.Errorf("list destinations of %s: no such process", v.Key())
	}
	out := make([]RealServer, 0, len(s.dests))
	for _, d := range s.dests {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b RealServer) int { return a.Addr().Compare(b.Addr()) })
	return out, nil
}

// AddRealServer implements Interface.
func (f *Fake) AddRealServer(v VirtualServer, r RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return fmt.Errorf("add destination %s to %s: no such process", r.Addr(), v.Key())
	}
	if _, dup := s.dests[r.Addr()]; dup {
		return fmt.Errorf("add destination %s to %s: file exists", r.Addr(), v.Key())
	}
	if r.Weight < 0 {
		return fmt.Errorf("add destination %s to %s: weight %d: invalid argument", r.Addr(), v.Key(), r.Weight)
	}
	r.ActiveConn, r.InactiveConn, r.InConns = 0, 0, 0
	s.dests[r.Addr()] = r
	f.Writes++
	f.DestWrites[destKey(v, r)]++
	return nil
}

// UpdateRealServer implements Interface; the connection counters are kept.
func (f *Fake) UpdateRealServer(v VirtualServer, r RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return fmt.Errorf("set weight of %s in %s: no such process", r.Addr(), v.Key())
	}
	old, ok := s.dests[r.Addr()]
	if !ok {
		return fmt.Errorf("set weight of %s in %s: no such file or directory", r.Addr(), v.Key())
	}
	old.Weight = r.Weight
	s.dests[r.Addr()] = old
	f.Writes++
	f.DestWrites[destKey(v, r)]++
	return nil
}

// DeleteRealServer implements Interface.
func (f *Fake) DeleteRealServer(v VirtualServer, r RealServer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[v.Key()]
	if !ok {
		return fmt.Errorf("delete destination %s from %s: no such process", r.Addr(), v.Key())
	}
	if _, ok := s.dests[r.Addr()]; !ok {
		return fmt.Errorf("delete destination %s from %s: no such file or directory", r.Addr(), v.Key())
	}
	delete(s.dests, r.Addr())
	f.Writes++
	f.DestWrites[destKey(v, r)]++
	return nil
}

// SetConns sets the live connection counters of a destination, as traffic
// would; it reports whether the destination exists.
func (f *Fake) SetConns(vip dataplane.VIP, dest netip.AddrPort, active, inactive int) bool {
	return f.updateDest(vip, dest, func(d *RealServer) { d.ActiveConn, d.InactiveConn = active, inactive })
}

// Schedule adds n to the connection count of a destination (InConns), as
// IPVS does for each connection it schedules there; it reports whether
// the destination exists.
func (f *Fake) Schedule(vip dataplane.VIP, dest netip.AddrPort, n uint64) bool {
	return f.updateDest(vip, dest, func(d *RealServer) { d.InConns += n })
}

// updateDest changes a destination's counters in place.
func (f *Fake) updateDest(vip dataplane.VIP, dest netip.AddrPort, change func(*RealServer)) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[vip]
	if !ok {
		return false
	}
	d, ok := s.dests[dest]
	if !ok {
		return false
	}
	change(&d)
	s.dests[dest] = d
	return true
}

// Dump renders the table like "ipvsadm -Ln", sorted, for tests to compare:
//
//	TCP 198.18.0.10:80 wrr
//	  -> 198.19.1.2:8080 10
func (f *Fake) Dump() string {
	vss, _ := f.VirtualServers()
	var b strings.Builder
	for _, v := range vss {
		fmt.Fprintf(&b, "%s %s %s\n", v.Protocol, netip.AddrPortFrom(v.Address, v.Port), v.Scheduler)
		rss, _ := f.RealServers(v)
		for _, r := range rss {
			fmt.Fprintf(&b, "  -> %s %d\n", r.Addr(), r.Weight)
		}
	}
	return b.String()
}

// FakeLinks keeps dummy interfaces and their addresses in memory.
type FakeLinks struct {
	mu    sync.Mutex
	links map[string][]netip.Addr
	// Other names interfaces that exist but are not dummies.
	Other map[string]bool
}

var _ Links = (*FakeLinks)(nil)

// NewFakeLinks returns a namespace with no dummy interface.
func NewFakeLinks() *FakeLinks {
	return &FakeLinks{links: map[string][]netip.Addr{}, Other: map[string]bool{}}
}

// EnsureDummy implements Links.
func (l *FakeLinks) EnsureDummy(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Other[name] {
		return fmt.Errorf("interface %s exists and is not a dummy", name)
	}
	if _, ok := l.links[name]; !ok {
		l.links[name] = nil
	}
	return nil
}

// Exists reports whether the dummy interface name exists.
func (l *FakeLinks) Exists(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.links[name]
	return ok
}

// Addresses implements Links.
func (l *FakeLinks) Addresses(name string) ([]netip.Addr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.links[name])
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// AddAddress implements Links.
func (l *FakeLinks) AddAddress(name string, a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	addrs, ok := l.links[name]
	if !ok {
		return fmt.Errorf("add %s: interface %s missing", a, name)
	}
	if !slices.Contains(addrs, a) {
		l.links[name] = append(addrs, a)
	}
	return nil
}

// DelAddress implements Links.
func (l *FakeLinks) DelAddress(name string, a netip.Addr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.links[name] = slices.DeleteFunc(l.links[name], func(x netip.Addr) bool { return x == a })
	return nil
}

// DeleteDummy implements Links.
func (l *FakeLinks) DeleteDummy(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.links, name)
	return nil
}

// FakeSets keeps ipsets in memory and enforces ipset's rules: members are
// added to existing sets only, a member's address has the set's family
// (inet, or inet6 with "family inet6" at creation), and a set is destroyed
// only when no rule references it (tests pass the check in Referenced).
type FakeSets struct {
	mu   sync.Mutex
	sets map[string]map[string]string
	// inet6 holds the sets created with "family inet6".
	inet6 map[string]bool
	// Referenced, when set, reports whether a rule uses the set.
	Referenced func(name string) bool
}

var _ Sets = (*FakeSets)(nil)

// NewFakeSets returns no sets.
func NewFakeSets() *FakeSets {
	return &FakeSets{sets: map[string]map[string]string{}, inet6: map[string]bool{}}
}

// Restore implements Sets with -exist semantics; it applies all lines or
// none.
func (s *FakeSets) Restore(text string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string]map[string]string{}
	for k, v := range s.sets {
		next[k] = map[string]string{}
		for m, c := range v {
			next[k][m] = c
		}
	}
	for n, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return fmt.Errorf("ipset restore (fake): line %d: %q", n+1, line)
		}
		set, ok := next[f[1]]
		switch f[0] {
		case "create":
			if !ok {
				next[f[1]] = map[string]string{}
				s.inet6[f[1]] = strings.Contains(line, " family inet6")
			}
		case "add", "del":
			if !ok {
				return fmt.Errorf("ipset restore (fake): line %d: the set with the given name does not exist", n+1)
			}
			if len(f) < 3 {
				return fmt.Errorf("ipset restore (fake): line %d: missing member", n+1)
			}
			if f[0] == "del" {
				delete(set, f[2])
				continue
			}
			ipS, _, _ := strings.Cut(f[2], ",")
			if ip, err := netip.ParseAddr(ipS); err != nil || ip.Is6() != s.inet6[f[1]] {
				return fmt.Errorf("ipset restore (fake): line %d: %s: address %q of the wrong family or unparsable", n+1, f[1], ipS)
			}
			comment := ""
			if i := strings.Index(line, " comment "); i >= 0 {
				comment = strings.Trim(strings.TrimSpace(line[i+len(" comment "):]), `"`)
			}
			set[f[2]] = comment
		default:
			return fmt.Errorf("ipset restore (fake): line %d: unsupported command %q", n+1, f[0])
		}
	}
	s.sets = next
	return nil
}

// Entries implements Sets, sorted by member.
func (s *FakeSets) Entries(name string) ([]SetEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SetEntry
	for m, c := range s.sets[name] {
		out = append(out, SetEntry{Member: m, Comment: c})
	}
	slices.SortFunc(out, func(a, b SetEntry) int { return strings.Compare(a.Member, b.Member) })
	return out, nil
}

// List implements Sets.
func (s *FakeSets) List(names []string) (map[string][]SetEntry, error) {
	out := map[string][]SetEntry{}
	for _, n := range names {
		es, _ := s.Entries(n)
		if es != nil {
			out[n] = es
		}
	}
	return out, nil
}

// Exists reports whether set name exists.
func (s *FakeSets) Exists(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sets[name]
	return ok
}

// Destroy implements Sets.
func (s *FakeSets) Destroy(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sets[name]; ok && s.Referenced != nil && s.Referenced(name) {
		return fmt.Errorf("ipset destroy %s (fake): set is in use by a kernel component", name)
	}
	delete(s.sets, name)
	return nil
}
