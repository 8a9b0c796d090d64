package ebpf

import (
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// countedDualStack returns the mode over nftables fakes and in-memory maps
// (two CPUs), with its maps for the test to play the programs.
func countedDualStack(counting bool) (*dataplane.DualStack, *maps) {
	nft := nftables.NewDualStack(knftables.NewFake(knftables.IPv4Family, nftables.TableName),
		knftables.NewFake(knftables.IPv6Family, nftables.TableName), nftables.Config{})
	m := memMapsFull()
	k := &kernel{m: m, cfg: Config{CountConnections: counting}, read: func() (*maps, bool, error) { return m, true, nil }}
	return k.dualStack(nft), m
}

// pick plays a program choosing backend be of vip on cpu n times.
func pick(t *testing.T, m *maps, vip, be string, cpu int, n uint64) {
	t.Helper()
	k := countKey{VIP: svcKey{Addr: netip.MustParseAddr(vip), Port: 80, Proto: protoTCP},
		Backend: backendVal{Addr: netip.MustParseAddr(be), Port: 8080}}
	if !m.counts.(*MemCounters).Add(k, cpu, n) {
		t.Fatalf("no counter for %s -> %s", vip, be)
	}
}

// countsOf returns the counts per endpoint address of Service port svc.
func countsOf(t *testing.T, d dataplane.Dataplane, svc string) map[string]uint64 {
	t.Helper()
	cs, err := d.Counts()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, c := range cs {
		if c.Service == svc {
			if c.Protocol != dataplane.TCP || c.Endpoint.Port() != 8080 {
				t.Errorf("count %+v: want TCP to port 8080", c)
			}
			out[c.Endpoint.Addr().String()] += c.NewConnections
		}
	}
	return out
}

func syncState(t *testing.T, d dataplane.Dataplane, sps ...dataplane.ServicePort) {
	t.Helper()
	if _, err := d.Sync(dataplane.State{Services: sps}, dataplane.SyncRequest{Full: true}); err != nil {
		t.Fatal(err)
	}
}

// TestCounts: the counts are summed over the CPUs and labelled with the
// Service port; a weight change keeps them, an endpoint that leaves takes
// its counter along, a port that goes takes its counters and name, and
// the IPv6 VIPs' counts are the IPv6 half's.
func TestCounts(t *testing.T) {
	d, m := countedDualStack(true)
	web := port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})
	db := port("198.18.0.11", map[string]float64{"198.19.2.2": 1})
	v6 := port("2001:2::10", map[string]float64{"2001:2::1:2": 1})
	syncState(t, d, web, db, v6)
	if n := m.counts.(*MemCounters).Len(); n != 4 {
		t.Errorf("%d counters, want one per VIP and backend (4)", n)
	}
	if got := countsOf(t, d, "ns/198.18.0.10:tcp"); len(got) != 2 || got["198.19.1.2"] != 0 || got["198.19.1.3"] != 0 {
		t.Errorf("before any choice: %v, want two zero counts", got)
	}
	pick(t, m, "198.18.0.10", "198.19.1.2", 0, 3)
	pick(t, m, "198.18.0.10", "198.19.1.2", 1, 4)
	pick(t, m, "198.18.0.10", "198.19.1.3", 1, 60)
	pick(t, m, "2001:2::10", "2001:2::1:2", 0, 5)
	if got := countsOf(t, d, "ns/198.18.0.10:tcp"); got["198.19.1.2"] != 7 || got["198.19.1.3"] != 60 {
		t.Errorf("counts %v, want 7 (3+4 over two CPUs) and 60", got)
	}
	if got := countsOf(t, d, "ns/2001:2::10:tcp"); got["2001:2::1:2"] != 5 {
		t.Errorf("IPv6 counts %v, want 5", got)
	}

	// A weight change: a new table under a new ID, the counts kept.
	web2 := port("198.18.0.10", map[string]float64{"198.19.1.2": 50, "198.19.1.3": 50, "198.19.1.4": 1})
	syncState(t, d, web2, db, v6)
	if got := countsOf(t, d, "ns/198.18.0.10:tcp"); got["198.19.1.2"] != 7 || got["198.19.1.3"] != 60 || got["198.19.1.4"] != 0 || len(got) != 3 {
		t.Errorf("after a weight change: %v, want 7, 60 and a new 0", got)
	}
	// An endpoint leaves, and the other port goes.
	web3 := port("198.18.0.10", map[string]float64{"198.19.1.3": 1, "198.19.1.4": 1})
	syncState(t, d, web3, v6)
	if got := countsOf(t, d, "ns/198.18.0.10:tcp"); got["198.19.1.3"] != 60 || len(got) != 2 {
		t.Errorf("after 198.19.1.2 left: %v, want 198.19.1.3 (60) and 198.19.1.4", got)
	}
	if got := countsOf(t, d, "ns/198.18.0.11:tcp"); len(got) != 0 {
		t.Errorf("a removed port still counts %v", got)
	}
	if n := m.names.(*MemMap).Len(); n != 2 {
		t.Errorf("%d names, want 2", n)
	}
	if got := countsOf(t, d, "ns/2001:2::10:tcp"); got["2001:2::1:2"] != 5 {
		t.Errorf("IPv6 counts after IPv4 changes: %v, want 5", got)
	}

	// A restart without --count-connections drops every counter and name.
	off := &kernel{m: m, cfg: Config{}, read: func() (*maps, bool, error) { return m, true, nil }}
	nft := nftables.NewDualStack(knftables.NewFake(knftables.IPv4Family, nftables.TableName),
		knftables.NewFake(knftables.IPv6Family, nftables.TableName), nftables.Config{})
	syncState(t, off.dualStack(nft), web3, v6)
	if n, k := m.counts.(*MemCounters).Len(), m.names.(*MemMap).Len(); n != 0 || k != 0 {
		t.Errorf("counting off: %d counters and %d names left", n, k)
	}
}

// TestCountsOff: without --count-connections nothing is created, so the
// programs (whose counting code the verifier removed anyway) count
// nothing, and Counts is empty.
func TestCountsOff(t *testing.T) {
	d, m := countedDualStack(false)
	syncState(t, d, port("198.18.0.10", map[string]float64{"198.19.1.2": 1}))
	if n := m.counts.(*MemCounters).Len(); n != 0 {
		t.Errorf("%d counters with counting off", n)
	}
	if cs, err := d.Counts(); err != nil || len(cs) != 0 {
		t.Errorf("Counts: %v (%v), want none", cs, err)
	}
}

// TestCountsLongName: a name longer than the map's field is stored as
// nftables' comments hold it, so the socket's and nftables' counts of one
// port are one.
func TestCountsLongName(t *testing.T) {
	d, m := countedDualStack(true)
	sp := port("198.18.0.10", map[string]float64{"198.19.1.2": 1})
	sp.Name.Name = strings.Repeat("r", 200)
	syncState(t, d, sp)
	pick(t, m, "198.18.0.10", "198.19.1.2", 0, 2)
	short := dataplane.ShortName(sp.Name.String(), dataplane.NftCommentMax)
	if got := countsOf(t, d, short); got["198.19.1.2"] != 2 {
		t.Errorf("counts of %q: %v, want 2", short, got)
	}
}

// TestSumCPUs: a per-CPU value is the sum of its CPUs'.
func TestSumCPUs(t *testing.T) {
	if n := sumCPUs([]uint64{1, 2, 0, 1 << 40}); n != 1<<40+3 {
		t.Errorf("sum %d", n)
	}
	if n := sumCPUs(nil); n != 0 {
		t.Errorf("sum of none %d", n)
	}
}
