package nftables

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	gnft "github.com/google/nftables"
)

// TestWeightRangesAsRbtree: a weight-map range is written as the kernel's
// rbtree elements (its start with the value, its end flagged, hi+1), a
// deletion names the same two, and the kernel's elements read back as the
// ranges, whatever their order: two ports' adjacent ranges (an end and a
// start of one key), a gap (the reject share), nft's end at 0.
func TestWeightRangesAsRbtree(t *testing.T) {
	f := famOf(4)
	tcp := protoNumbers["tcp"]
	a := netip.MustParseAddrPort("198.19.1.2:8080")
	b := netip.MustParseAddrPort("198.19.1.3:8080")
	key := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	val := func(ap netip.AddrPort) []byte {
		return append(ap.Addr().AsSlice(), byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
	}

	e := &wmElem{lo: 1000, hi: 1099, dnat: a}
	got, err := mapElem{"dn-0001", tcp, e}.netlink(f, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []gnft.SetElement{{Key: key(1000), Val: val(a)}, {Key: key(1100), IntervalEnd: true}}
	if !slices.EqualFunc(got, want, sameElem) {
		t.Errorf("add: %+v, want %+v", got, want)
	}
	got, _ = mapElem{"dn-0001", tcp, e}.netlink(f, false)
	want = []gnft.SetElement{{Key: key(1000)}, {Key: key(1100), IntervalEnd: true}}
	if !slices.EqualFunc(got, want, sameElem) {
		t.Errorf("delete: %+v, want %+v", got, want)
	}
	// The last draw: no end element.
	got, _ = mapElem{"dn-0001", tcp, &wmElem{lo: 7, hi: ^uint32(0), dnat: a}}.netlink(f, true)
	if len(got) != 1 || got[0].IntervalEnd {
		t.Errorf("range to the last draw: %+v, want its start only", got)
	}
	// The reject share of an affinity port goes over netlink too.
	if _, err := (mapElem{"wv-0001", tcp, &wmElem{lo: 5, hi: 9, to: vReturn}}).netlink(f, true); err != nil {
		t.Errorf("return element: %v", err)
	}

	// Read back: port 1 (draws 0-99: a 0-9, b 10-89, reject 90-99), port 2
	// in the next slot (draws 100-199: a 100-199), nft's end at 0.
	ranges := []wmElem{{lo: 0, hi: 9, dnat: a}, {lo: 10, hi: 89, dnat: b}, {lo: 100, hi: 199, dnat: a}}
	var pts []wmPoint
	for i := range ranges {
		els, err := mapElem{"dn-0001", tcp, &ranges[i]}.netlink(f, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, el := range els {
			raw := rawElem{key: el.Key, val: el.Val, intervalEnd: el.IntervalEnd}
			p, err := decodeWeightElem(&raw, true, 4)
			if err != nil {
				t.Fatal(err)
			}
			pts = append(pts, p)
		}
	}
	pts = append(pts, wmPoint{key: 0, end: true})
	rand.Shuffle(len(pts), func(i, j int) { pts[i], pts[j] = pts[j], pts[i] })
	if back := wmRanges(pts); !slices.Equal(back, ranges) {
		t.Errorf("read back %+v, want %+v", back, ranges)
	}
}

func sameElem(a, b gnft.SetElement) bool {
	return slices.Equal(a.Key, b.Key) && slices.Equal(a.Val, b.Val) && a.IntervalEnd == b.IntervalEnd && len(a.KeyEnd) == 0 && len(b.KeyEnd) == 0
}
