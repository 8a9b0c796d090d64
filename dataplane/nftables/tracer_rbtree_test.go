package nftables

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// The tracer's weight maps: how the kernel looks a draw up in a
// single-field interval map (an rbtree), modelled from the Fake's ranges
// and sharing no code with the production reader (wmRanges).

// rbPoint is one element of an interval map in the kernel's rbtree: a
// range's start (with its value) or its end.
type rbPoint struct {
	key   uint64
	end   bool
	value []string
}

// rbtree turns the ranges of map m, as the Fake lists them ("lo-hi :
// value", the key the draw alone), into the elements the kernel keeps
// for a single-field interval map: the start lo with the value and the
// end hi+1, sorted by key, an end before a start of the same key.
// Overlapping ranges fail the test (the kernel refuses them).
func (tr *tracer) rbtree(m string) []rbPoint {
	wm := tr.tab.Maps[m]
	var pts []rbPoint
	type rg struct{ lo, hi uint64 }
	var rgs []rg
	for _, e := range wm.Elements {
		k := fieldsOf(e.Key)
		if len(k) != 1 {
			tr.t.Errorf("tracer: map %s: key %q is not the draw alone", m, e.Key)
			continue
		}
		lo, hi, ok := strings.Cut(k[0], "-")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 32)
		h, err2 := strconv.ParseUint(hi, 10, 32)
		if err1 != nil || err2 != nil || h < l {
			tr.t.Errorf("tracer: map %s: range %q", m, k[0])
			continue
		}
		rgs = append(rgs, rg{l, h})
		pts = append(pts, rbPoint{key: l, value: fieldsOf(e.Value)}, rbPoint{key: h + 1, end: true})
	}
	slices.SortFunc(rgs, func(a, b rg) int { return cmpU64(a.lo, b.lo) })
	for i := 1; i < len(rgs); i++ {
		if rgs[i].lo <= rgs[i-1].hi {
			tr.t.Errorf("tracer: map %s: ranges %d-%d and %d-%d overlap", m, rgs[i-1].lo, rgs[i-1].hi, rgs[i].lo, rgs[i].hi)
		}
	}
	slices.SortFunc(pts, func(a, b rbPoint) int {
		if c := cmpU64(a.key, b.key); c != 0 {
			return c
		}
		if a.end == b.end {
			return 0
		}
		if a.end {
			return -1
		}
		return 1
	})
	return pts
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// lookup is the rbtree's lookup of a draw: the last element whose key is
// not above it (a start wins over an end of its key); an end, or nothing,
// misses. at is the element's index.
func lookup(pts []rbPoint, draw uint64) (value []string, at int, hit bool) {
	i, _ := slices.BinarySearchFunc(pts, draw+1, func(p rbPoint, k uint64) int { return cmpU64(p.key, k) })
	if i == 0 || pts[i-1].end {
		return nil, -1, false
	}
	return pts[i-1].value, i - 1, true
}

// split follows every draw off to off+mod-1 through weight map m as the
// kernel looks it up (rbtree, lookup above), run by run between the
// map's element keys: a DNAT map's value is the endpoint, a verdict map's
// the verdict; the draws that miss (the reject share) go on with the next
// rule. A range that crosses the draws' bounds fails the test: ports
// share a map only in disjoint slots.
func (tr *tracer) split(mod, off uint64, m string, p pkt, f flow, verb, text string) []branch {
	if tr.tab.Maps[m] == nil {
		tr.t.Errorf("tracer: no map %s (rule %q)", m, text)
		return []branch{{f, ""}}
	}
	pts := tr.rbtree(m)
	first, end := off, off+mod
	cuts := []uint64{first, end}
	for _, pt := range pts {
		if pt.key > first && pt.key < end {
			cuts = append(cuts, pt.key)
		}
	}
	// A range that starts before the draws or runs past them.
	if _, at, hit := lookup(pts, first); hit && pts[at].key < first {
		tr.t.Errorf("tracer: map %s: the range from %d crosses the draws %d-%d", m, pts[at].key, first, end-1)
	}
	if _, at, hit := lookup(pts, end); hit && pts[at].key < end {
		tr.t.Errorf("tracer: map %s: the range from %d crosses the draws %d-%d", m, pts[at].key, first, end-1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []branch
	missed := uint64(0)
	for i := 0; i+1 < len(cuts); i++ {
		n := cuts[i+1] - cuts[i]
		v, _, hit := lookup(pts, cuts[i])
		if !hit {
			missed += n
			continue
		}
		g := f
		g.share = f.share * float64(n) / float64(mod)
		switch verb {
		case "map":
			if len(v) != 2 {
				tr.t.Errorf("tracer: map %s: value %q", m, v)
				continue
			}
			port, err := strconv.ParseUint(v[1], 10, 16)
			if err != nil {
				tr.t.Errorf("tracer: map %s: value %q", m, v)
				continue
			}
			g.dst, g.dnat = netip.AddrPortFrom(netip.MustParseAddr(v[0]), uint16(port)), true
			out = append(out, branch{g, ""})
		case "vmap":
			out = append(out, branch{g, strings.Join(v, " ")})
		default:
			tr.t.Fatalf("tracer: %q in %q", verb, text)
		}
	}
	if missed > 0 {
		g := f
		g.share = f.share * float64(missed) / float64(mod)
		out = append(out, branch{g, ""})
	}
	return out
}
