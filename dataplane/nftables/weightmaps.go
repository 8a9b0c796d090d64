package nftables

import (
	"fmt"
	"hash/fnv"
	"slices"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Shared weight maps (issue 21). A split chain draws "numgen random mod
// Buckets offset K" and looks the draw up in one of WeightShards maps
// shared by several Service ports: the port's elements are its ranges
// moved by K, so ports sharing a map never overlap. Why: the kernel finds
// a map for each element dump by walking the table's list of sets, so
// reading 100,000 elements in 10,000 per-port maps cost 5.0 CPU-s
// (explain could not get under 1 s at 10,000 Services); in 1,024 maps
// 0.10-0.22 CPU-s, while one port's change (its elements out and in, one
// commit) stays at 15-20 ms. Fewer, bigger maps cost more per change (64
// maps: 177 ms; the kernel rebuilds an interval map per commit, so the
// cost grows with the map): BenchmarkWeightMapLayouts, docs/benchmarks.md.
// 1,024 keeps about ten ports per map at 10,000 and thirty at 30,000.
//
// Counted DNAT maps (CountConnections) stay one per port: Counts reads
// each map's comment to name the Service port of its counters.

// WeightShards is how many shared weight maps of each kind a table holds
// at most ("dn-0000".."dn-1023" for DNAT, "wv-..." for verdict maps).
const WeightShards = 1024

// weightMapKey is the typeof of every weight map's key (the modulus in a
// typeof is only the type; each rule draws with its own).
const weightMapKey = "numgen random mod 1 : "

// slotsPerShard: a port's offset is its slot times Buckets, and the last
// slot's draws must stay below 2^32.
const slotsPerShard = (1<<32)/Buckets - 1

// Prefixes of the shared weight maps. Their key is the draw alone
// ("numgen random mod 1", an interval map), so the kernel keeps them in
// its rbtree backend. Up to 2026-12-07 it was "numgen . meta l4proto" in
// maps named "dm-"/"wm-" (legacyDNATPrefix, legacyVerdictPrefix): a
// concatenated interval key makes the kernel use pipapo, which clones and
// rebuilds its lookup tables on every commit, so a change cost in
// proportion to the map's elements (perf of the partial sync at 30,000
// Services: nft_pipapo_remove 21 %, bitmap_cut 12 %; first sync at
// 1,000 x 100: nft_pipapo_insert 57 %). With the rbtree a change touches
// only its elements (plain nft -f of 1,000 maps, kernel sys 2.76 -> ~1.0 s
// at 100 endpoints per port, docs/data/first-sync-2026-12-07b/nft-keys.txt).
// The concatenation had kept nft 1.0.6 from reading every plain interval
// set before each element command (the package comment); every element
// of a sync now goes over netlink (netlink.go, firstsync.go), so only a
// transaction through nft with elements in it (a full resync, or a
// partial one beyond maxNetlinkOps) pays that read, once per nft run.
//
// A map's key type cannot change in place, so the new maps have new
// names: after an upgrade the first full sync finds every split chain
// without its map, writes the new maps and the chain's new rule in one
// transaction, and marks the old maps unused (deleted StaleDelay later,
// as any unused map).
//
// A DNAT map's values name the protocol ("ip daddr . tcp dport"), and nft
// checks a rule "meta l4proto udp dnat ... map @m" against m's typeof
// ("conflicting protocols specified"), so the DNAT maps are shared per
// protocol: dn- for TCP, du- for UDP, ds- for SCTP. "th dport" would
// serve all three, but nft 1.0.6 refuses every rule against such a map
// once it reads the typeof back from the kernel (a restart's full sync).
// One map for every protocol failed every sync through nft once a TCP and
// a UDP port hashed to one map (the steelyard-ebpf conformance run of
// 2026-12-07, 142 Services; TestSharedMapProtocolsKernel).
const (
	sharedDNATPrefix    = "dn-" // TCP
	sharedUDPPrefix     = "du-"
	sharedSCTPPrefix    = "ds-"
	sharedVerdictPrefix = "wv-"
	legacyDNATPrefix    = "dm-"
	legacyVerdictPrefix = "wm-"
)

// sharedPrefixes are the prefixes of the shared weight maps.
var sharedPrefixes = []string{sharedDNATPrefix, sharedUDPPrefix, sharedSCTPPrefix, sharedVerdictPrefix}

// sharedMap reports whether m is a shared weight map.
func sharedMap(m string) bool {
	return len(m) > 3 && slices.Contains(sharedPrefixes, m[:3])
}

// slotTable places each split chain in a shared map: the map from a hash
// of the chain's name, the slot from the rest of it, the next free one
// when another chain has it. Stable while the chain exists; after a
// restart the slots may differ (two chains on one hashed slot are placed
// in the order they are rendered), which a restart's full sync makes
// right: it flushes every shared map it touches and writes every port's
// elements and rules again (writer.port, repairShared).
type slotTable struct {
	of   map[placeKey]uint32
	used map[string]map[uint32]string // map -> slot -> chain
}

type placeKey struct{ chain, m string }

func newSlotTable() *slotTable {
	return &slotTable{of: map[placeKey]uint32{}, used: map[string]map[uint32]string{}}
}

func chainHash(chain string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(chain))
	return h.Sum32()
}

// shardName is the shared map of split chain chain: a DNAT map of its
// protocol proto, or with ClientIP affinity a verdict map.
func shardName(chain string, dnat bool, proto uint8) string {
	pfx := sharedVerdictPrefix
	switch {
	case dnat && proto == protoNumbers["udp"]:
		pfx = sharedUDPPrefix
	case dnat && proto == protoNumbers["sctp"]:
		pfx = sharedSCTPPrefix
	case dnat:
		pfx = sharedDNATPrefix
	}
	return fmt.Sprintf("%s%04d", pfx, chainHash(chain)%WeightShards)
}

// place returns the offset of chain's draws in shared map m.
func (s *slotTable) place(chain, m string) uint32 {
	k := placeKey{chain, m}
	slot, ok := s.of[k]
	if !ok {
		used := s.used[m]
		if used == nil {
			used = map[uint32]string{}
			s.used[m] = used
		}
		slot = chainHash(chain) / WeightShards % slotsPerShard
		for used[slot] != "" {
			slot = (slot + 1) % slotsPerShard
		}
		used[slot] = chain
		s.of[k] = slot
	}
	return slot * Buckets
}

// release frees chain's slot in m.
func (s *slotTable) release(k placeKey) {
	if slot, ok := s.of[k]; ok {
		delete(s.used[k.m], slot)
		delete(s.of, k)
	}
}

// placesOf are the (chain, shared map) places of o's splits.
func placesOf(o *portObjects) []placeKey {
	var out []placeKey
	for c, rules := range o.chains {
		for _, rl := range rules {
			switch s := rl[len(rl)-1].(type) {
			case numgenDNAT:
				if sharedMap(s.m) {
					out = append(out, placeKey{c, s.m})
				}
			case numgenVmap:
				if sharedMap(s.m) {
					out = append(out, placeKey{c, s.m})
				}
			}
		}
	}
	return out
}

// ensureShared adds shared map m to the transaction unless the kernel
// has it (listed by a full sync, or written by an earlier commit), and
// keeps it from a pending deletion.
func (w *writer) ensureShared(tx txn, m string, wm *weightMap) {
	w.revive("map", m)
	there := w.p.shardMaps[m]
	if w.full {
		there = w.live.maps[m]
	}
	if there || w.created[m] {
		return
	}
	tx.Add(&knftables.Map{Name: m, TypeOf: weightMapKey + wm.data(w.p.f), Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	if w.created == nil {
		w.created = map[string]bool{}
	}
	w.created[m] = true
}

// flushShared flushes shared map m once in a full sync that listed it:
// its elements are written again by the ports this sync writes and, for
// the others, by repairShared.
func (w *writer) flushShared(tx txn, m string) {
	if !w.live.maps[m] || w.flushed[m] {
		return
	}
	tx.Flush(&knftables.Map{Name: m})
	if w.flushed == nil {
		w.flushed = map[string]bool{}
	}
	w.flushed[m] = true
}

// sharedElems writes the elements of port n's shared weight maps: in a
// partial sync the difference between old's and o's (a port's removal
// deletes its elements, its change replaces them), in a full sync o's
// into maps flushed first. Places that o no longer uses are freed once
// the sync commits.
func (w *writer) sharedElems(tx txn, n dataplane.ServicePortName, old, o *portObjects) {
	for _, m := range sortedKeys(o.maps) {
		if !sharedMap(m) {
			continue
		}
		wm := o.maps[m]
		var prev []wmElem
		if w.full {
			w.flushShared(tx, m)
		} else if om, ok := old.maps[m]; ok {
			prev = om.elems
		}
		for i := range prev {
			if !slices.Contains(wm.elems, prev[i]) {
				tx.DeleteElem(mapElem{m, wm.proto, &prev[i]})
			}
		}
		for i := range wm.elems {
			if !slices.Contains(prev, wm.elems[i]) {
				tx.AddElem(mapElem{m, wm.proto, &wm.elems[i]})
			}
		}
	}
	for _, m := range sortedKeys(old.maps) {
		if !sharedMap(m) {
			continue
		}
		if _, ok := o.maps[m]; ok {
			continue
		}
		if w.full {
			w.flushShared(tx, m)
			continue
		}
		om := old.maps[m]
		for i := range om.elems {
			tx.DeleteElem(mapElem{m, om.proto, &om.elems[i]})
		}
	}
	if w.written == nil {
		w.written = map[dataplane.ServicePortName]bool{}
	}
	w.written[n] = true
	kept := map[placeKey]bool{}
	for _, k := range placesOf(o) {
		kept[k] = true
	}
	for _, k := range placesOf(old) {
		if !kept[k] {
			w.freed = append(w.freed, k)
		}
	}
}

// repairShared ends a full sync that flushed shared maps: the ports it
// did not write put their elements back into them.
func (w *writer) repairShared(tx txn, applied map[dataplane.ServicePortName]*portObjects) {
	for _, n := range sortedPorts(applied) {
		if w.written[n] {
			continue
		}
		o := applied[n]
		for _, m := range sortedKeys(o.maps) {
			if !w.flushed[m] {
				continue
			}
			wm := o.maps[m]
			for i := range wm.elems {
				tx.AddElem(mapElem{m, wm.proto, &wm.elems[i]})
			}
		}
	}
}

// sharedCommitted records what a commit did to the shared maps.
func (w *writer) sharedCommitted() {
	for m := range w.created {
		w.p.shardMaps[m] = true
	}
	w.created = nil
}

// sharedDone frees the places of the splits that went, once the whole
// sync committed. A shared map left without a port waits StaleDelay and
// is deleted, as a port's own map was (a port placed there before then
// keeps it); the shared maps deleted are forgotten.
func (w *writer) sharedDone() {
	for _, k := range w.freed {
		w.p.slots.release(k)
		sk := staleKey{"map", k.m}
		if _, waiting := w.p.stale[sk]; !waiting && len(w.p.slots.used[k.m]) == 0 {
			w.p.stale[sk] = w.p.now()
		}
	}
	for k := range w.reaped {
		if k.kind == "map" && len(w.p.slots.used[k.name]) == 0 {
			delete(w.p.shardMaps, k.name)
		}
	}
}
