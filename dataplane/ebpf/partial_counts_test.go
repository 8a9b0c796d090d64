package ebpf

import (
	"fmt"
	stdmaps "maps"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// countingCounters counts whole-map reads (Each) of the counters it wraps.
type countingCounters struct {
	*MemCounters
	eaches int
}

func (c *countingCounters) Each(fn func(countKey, uint64)) error {
	c.eaches++
	return c.MemCounters.Each(fn)
}

// memContents returns a map's entries (key and value bytes, printed).
func memContents(t *testing.T, m *MemMap) map[string]string {
	t.Helper()
	out := map[string]string{}
	for k, v := range m.entries {
		out[fmt.Sprintf("%x", k)] = fmt.Sprintf("%x", v)
	}
	return out
}

// TestPartialCountsAndMembersByKey: with counting on and an affinity port,
// partial Syncs leave the counters, names and affinity members exactly as
// full Syncs of the same states do, without walking those maps (the last
// Sync's tables say what is there).
func TestPartialCountsAndMembersByKey(t *testing.T) {
	d, m := countedDualStack(true)
	ref, rm := countedDualStack(true)
	counters := &countingCounters{MemCounters: m.counts.(*MemCounters)}
	names := &countingMap{MemMap: m.names.(*MemMap)}
	members := &countingMap{MemMap: m.members.(*MemMap)}
	m.counts, m.names, m.members = counters, names, members

	web := port("198.18.0.10", map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90})
	web.AffinitySeconds = 30
	db := port("198.18.0.11", map[string]float64{"198.19.2.2": 1})
	other := port("198.18.0.12", map[string]float64{"198.19.3.2": 1})
	step := func(what string, changed []string, ports ...dataplane.ServicePort) {
		t.Helper()
		s := dataplane.State{Services: ports}
		s.Sort()
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}}
		for _, n := range changed {
			req.Changed[dataplane.ServiceName{Namespace: "ns", Name: n}] = true
		}
		counters.eaches, names.eaches, members.eaches = 0, 0, 0
		res, err := d.Sync(s, req)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Full && (counters.eaches != 0 || names.eaches != 0 || members.eaches != 0) {
			t.Errorf("%s: a partial sync walked counts %d, names %d, members %d times", what,
				counters.eaches, names.eaches, members.eaches)
		}
		if _, err := ref.Sync(s, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		var got, want []string
		counters.MemCounters.Each(func(k countKey, _ uint64) { got = append(got, fmt.Sprint(k)) })
		rm.counts.Each(func(k countKey, _ uint64) { want = append(want, fmt.Sprint(k)) })
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: counters %v, full sync has %v", what, got, want)
		}
		if g, w := memContents(t, names.MemMap), memContents(t, rm.names.(*MemMap)); !stdmaps.Equal(g, w) {
			t.Errorf("%s: names %v, full sync has %v", what, g, w)
		}
		if g, w := memContents(t, members.MemMap), memContents(t, rm.members.(*MemMap)); !stdmaps.Equal(g, w) {
			t.Errorf("%s: members %v, full sync has %v", what, g, w)
		}
	}
	step("first", nil, web, db, other)
	if members.Len() != 2 || counters.Len() != 4 || names.Len() != 3 {
		t.Fatalf("first sync: %d members, %d counters, %d names; want 2, 4, 3", members.Len(), counters.Len(), names.Len())
	}
	web2 := port("198.18.0.10", map[string]float64{"198.19.1.3": 1, "198.19.1.4": 1})
	web2.AffinitySeconds = 30
	step("an affinity endpoint replaced", []string{"198.18.0.10"}, web2, db, other)
	web3 := port("198.18.0.10", map[string]float64{"198.19.1.3": 1, "198.19.1.4": 1})
	step("affinity off", []string{"198.18.0.10"}, web3, db, other)
	step("a port goes", []string{"198.18.0.11"}, web3, other)
	db2 := port("198.18.0.11", map[string]float64{"198.19.2.5": 1, "198.19.2.6": 2})
	db2.AffinitySeconds = 5
	step("a port comes with affinity", []string{"198.18.0.11"}, web3, db2, other)
}
