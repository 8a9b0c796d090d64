//go:build e2e

package nftables

import (
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// TestWeightMapNeighboursKernel runs against the real kernel (as root, in
// a throwaway network namespace it creates): two ports in adjacent slots
// of one shared weight map, written over netlink as rbtree start and end
// elements. Deleting one port's ranges, whose last end has the key of its
// neighbour's first start, leaves the neighbour whole; nft (an
// independent decoder) and steelyard's reader list the same ranges after
// each step.
func TestWeightMapNeighboursKernel(t *testing.T) {
	if inThrowawayNetns(t, "STEELYARD_WM_NETNS", "sywm") {
		weightMapNeighbours(t)
	}
}

func weightMapNeighbours(t *testing.T) {
	const m = "dn-0001"
	if out, err := exec.Command("nft", "add table ip "+TableName+"; add map ip "+TableName+" "+m+
		" { typeof numgen random mod 1 : ip daddr . tcp dport; flags interval; }").CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	defer exec.Command("nft", "delete table ip "+TableName).Run() //nolint:errcheck
	w := newNetlinkWriter(4)
	tcp := protoNumbers["tcp"]
	ap := netip.MustParseAddrPort
	commit := func(add, del []wmElem) {
		t.Helper()
		var tx ops
		for i := range del {
			tx.DeleteElem(mapElem{m, tcp, &del[i]})
		}
		for i := range add {
			tx.AddElem(mapElem{m, tcp, &add[i]})
		}
		c, err := w.build(&tx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// check compares nft's listing and steelyard's reader with want.
	check := func(step string, want []wmElem) {
		t.Helper()
		out, err := exec.Command("nft", "list", "map", "ip", TableName, m).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list map: %v: %s", err, out)
		}
		var listed []string
		for _, x := range regexp.MustCompile(`(\d+(?:-\d+)?) : ([\d.]+) \. (\d+)`).FindAllStringSubmatch(string(out), -1) {
			listed = append(listed, x[1]+" "+x[2]+":"+x[3])
		}
		var wantText []string
		for _, e := range want {
			r := e.dnat.String()
			if e.lo == e.hi {
				wantText = append(wantText, itoa(e.lo)+" "+r)
			} else {
				wantText = append(wantText, itoa(e.lo)+"-"+itoa(e.hi)+" "+r)
			}
		}
		if !slices.Equal(listed, wantText) {
			t.Errorf("%s: nft lists %q, want %q\n%s", step, listed, wantText, out)
		}
		c, err := netlinkDial()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var pts []wmPoint
		err = eachElem(c, byte(famOf(4).nfproto()), m, func(e *rawElem) error {
			p, err := decodeWeightElem(e, true, 4)
			pts = append(pts, p)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := wmRanges(pts); !slices.Equal(got, want) {
			t.Errorf("%s: read back %+v, want %+v", step, got, want)
		}
	}
	// Port A in slot 0 (draws 0-99), port B in slot 1 (100-199): A's
	// last end is B's first start, key 100.
	a := []wmElem{{lo: 0, hi: 9, dnat: ap("198.19.1.2:8080")}, {lo: 10, hi: 99, dnat: ap("198.19.1.3:8080")}}
	b := []wmElem{{lo: 100, hi: 149, dnat: ap("198.19.1.4:80")}, {lo: 150, hi: 199, dnat: ap("198.19.1.2:8080")}}
	commit(append(slices.Clone(a), b...), nil)
	check("both ports", append(slices.Clone(a), b...))
	commit(nil, a)
	check("port A deleted", b)
	// A again, changed: a reject share (a gap) before B.
	a2 := []wmElem{{lo: 0, hi: 49, dnat: ap("198.19.1.2:8080")}, {lo: 50, hi: 89, dnat: ap("198.19.1.3:8080")}}
	commit(a2, nil)
	check("port A back with a gap", append(slices.Clone(a2), b...))
	// One of B's ranges changes in place, the other stays.
	b2 := []wmElem{{lo: 100, hi: 119, dnat: ap("198.19.1.4:80")}, {lo: 120, hi: 149, dnat: ap("198.19.1.5:80")}}
	commit(b2, b[:1])
	check("port B's first range split", append(append(slices.Clone(a2), b2...), b[1]))
	commit(nil, append(b2, b[1]))
	check("port B deleted", a2)
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
