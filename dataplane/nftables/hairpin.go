package nftables

import (
	"bytes"
	"net/netip"
	"slices"
	"strconv"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The hairpin set: a pod that reaches itself through a VIP must be
// masqueraded, or its reply (to its own address) would never be
// un-DNATed. Ports without endpoint chains (no ClientIP affinity) cannot
// mark that in the chain that DNATs, so nat postrouting matches it in one
// shared set, as kube-proxy's IPVS mode does with KUBE-LOOP-BACK:
//
//	ct status dnat ip daddr . meta l4proto . th dport . ip saddr @hairpin jump mark-for-masquerade
//
// Why this key and not "ip saddr . ip daddr": only connections DNATed to
// the endpoint's own port and protocol match. A host-network endpoint has
// the node's address; with addresses alone every DNATed connection from
// the node to itself would be masqueraded, whereas the endpoint chains
// marked only those sent to that endpoint.
const setHairpin = "hairpin"

// hairpinRule is the rule of the masquerading chain that marks hairpin
// connections (before the mark is checked).
func (p *Proxier) hairpinRule() rule {
	return r(hairpinMatch{}, jump(chainMarkMasq))
}

// hairpinKey is one element of the hairpin set: an endpoint connecting to
// itself. Free of pointers (an address as 16 bytes, the protocol's
// number), so the garbage collector does not scan the Proxier's 100,000
// of them at 10,000 Services x 10 endpoints.
type hairpinKey struct {
	addr  [16]byte // IPv4 as IPv4-mapped
	proto uint8
	port  uint16
}

func newHairpinKey(a netip.Addr, proto uint8, port uint16) hairpinKey {
	return hairpinKey{addr: a.As16(), proto: proto, port: port}
}

// fields are the key as nft lists it: "198.19.1.2 . tcp . 8080 . 198.19.1.2".
func (k hairpinKey) fields() []string {
	a := netip.AddrFrom16(k.addr).Unmap().String()
	proto, ok := protoNames[k.proto]
	if !ok {
		proto = strconv.Itoa(int(k.proto))
	}
	return []string{a, proto, strconv.Itoa(int(k.port)), a}
}

// Two Service ports can share an endpoint address and port (two Services
// over the same pods), so the set's elements are reference counted: an
// element is deleted only when no applied Service port needs it. The
// counts are derived from the applied state: a partial sync changes them
// by what its ports gained and lost and they are committed with the
// applied state; a full sync that lists the table counts every applied
// port again and compares with the set's live elements.

// hairpinRef records that the port written now gains (+1) or loses (-1)
// key k. Partial syncs only (one transaction): the net changes are
// written by hairpinOps.
func (w *writer) hairpinRef(k hairpinKey, d int) {
	if w.hpDelta == nil {
		w.hpDelta = map[hairpinKey]int{}
	}
	w.hpDelta[k] += d
}

// hairpinPort records the hairpin elements of a port rewritten from old to
// o (either may be nil). In a full sync the elements of o missing from the
// kernel are added at once (the first sync runs in batches: each batch
// brings its ports' elements); repair deletes the rest.
func (w *writer) hairpinPort(tx txn, old, o *portObjects) {
	if w.full {
		// Counted too: a first sync into an empty table has no repair,
		// so these are all its counts (repair recounts every port).
		if w.hpRefs == nil {
			w.hpRefs = map[hairpinKey]int{}
		}
		for _, k := range o.hairpin {
			w.hpRefs[k]++
			w.hairpinSeen(tx, k)
		}
		return
	}
	had := map[hairpinKey]bool{}
	for _, k := range old.hairpin {
		had[k] = true
	}
	for _, k := range o.hairpin {
		if had[k] {
			delete(had, k)
			continue
		}
		w.hairpinRef(k, 1)
	}
	for k := range had {
		w.hairpinRef(k, -1)
	}
}

// hairpinSeen adds k in a full sync unless it was written already or the
// kernel has it.
func (w *writer) hairpinSeen(tx txn, k hairpinKey) {
	if w.hpSeen == nil {
		w.hpSeen = map[hairpinKey]bool{}
	}
	if w.hpSeen[k] {
		return
	}
	w.hpSeen[k] = true
	if !w.live.hairpin[k] {
		tx.AddElem(k)
	}
}

// hairpinOps writes the net changes of a partial sync: an element whose
// count rises from 0 is added, one that falls to 0 deleted, so an
// endpoint handed from one port to another in one sync is left alone.
func (w *writer) hairpinOps(tx txn) {
	if w.full {
		return
	}
	for _, k := range sortedHairpin(w.hpDelta) {
		before := w.p.hairpin[k]
		after := before + w.hpDelta[k]
		switch {
		case before == 0 && after > 0:
			tx.AddElem(k)
		case before > 0 && after <= 0:
			tx.DeleteElem(k)
		}
	}
}

// hairpinRepair ends a full sync: counts every applied port's elements,
// adds those not written yet and missing from the kernel, and deletes the
// live ones no port needs.
func (w *writer) hairpinRepair(tx txn, applied map[dataplane.ServicePortName]*portObjects) {
	refs := map[hairpinKey]int{}
	for _, n := range sortedPorts(applied) {
		for _, k := range applied[n].hairpin {
			refs[k]++
			w.hairpinSeen(tx, k)
		}
	}
	for _, k := range sortedHairpin(w.live.hairpin) {
		if refs[k] == 0 {
			tx.DeleteElem(k)
		}
	}
	w.hpRefs = refs
}

// hairpinCommit makes the counts of a successful sync the Proxier's.
func (w *writer) hairpinCommit() {
	if w.hpRefs != nil {
		w.p.hairpin = w.hpRefs
		return
	}
	for k, d := range w.hpDelta {
		if n := w.p.hairpin[k] + d; n > 0 {
			w.p.hairpin[k] = n
		} else {
			delete(w.p.hairpin, k)
		}
	}
}

func sortedHairpin[V any](m map[hairpinKey]V) []hairpinKey {
	out := make([]hairpinKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b hairpinKey) int {
		if c := bytes.Compare(a.addr[:], b.addr[:]); c != 0 {
			return c
		}
		if a.proto != b.proto {
			return int(a.proto) - int(b.proto)
		}
		return int(a.port) - int(b.port)
	})
	return out
}
