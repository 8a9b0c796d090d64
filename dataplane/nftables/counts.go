package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Counting new connections per endpoint (issue 23). With CountConnections
// each DNAT map ("nc-"/"nl-") carries a counter on every element: the
// lookup that picks an endpoint's numgen range bumps that element's
// counter, and nat chains see only the first packet of a connection, so
// its packet count is the endpoint's count of new connections. No rule,
// chain or object is added per endpoint. An element is rewritten, and its
// count restarts, when its Service port's split changes (an endpoint comes
// or goes, a weight changes: the numgen ranges move) or a full sync finds
// the map differs from what it wrote; counts of the Service ports that did
// not change are kept. Ports with ClientIP affinity are not counted.

// Attributes of element expressions x/sys/unix does not name.
const (
	nftaSetElemExpr        = 7  // NFTA_SET_ELEM_EXPR: one expression
	nftaSetElemExpressions = 11 // NFTA_SET_ELEM_EXPRESSIONS: a list
	nftaCounterPackets     = 2  // NFTA_COUNTER_PACKETS, big-endian u64
)

// elemCounter reads the packet count of an element's counter expression.
func elemCounter(ea elemAttrs) (uint64, bool) {
	var exprs [][]byte
	if e := ea.get(nftaSetElemExpr); e != nil {
		exprs = append(exprs, e)
	}
	if l := ea.get(nftaSetElemExpressions); l != nil {
		more, _ := list(l)
		exprs = append(exprs, more...)
	}
	for _, e := range exprs {
		if strings.TrimRight(string(attrGet(e, unix.NFTA_EXPR_NAME)), "\x00") != "counter" {
			continue
		}
		if v := attrGet(attrGet(e, unix.NFTA_EXPR_DATA), nftaCounterPackets); len(v) == 8 {
			return binary.BigEndian.Uint64(v), true
		}
	}
	return 0, false
}

// Counts implements dataplane.Dataplane: one netlink dump of the table's
// sets, then one of each counted map's elements.
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	if p.netlink == nil {
		return nil, nil // a fake kernel has no counters
	}
	c, err := netlinkDial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	r := &nlReader{c: c, nfProt: unix.NFPROTO_IPV4, elems: map[string][]nlElem{}}
	alen := 4
	if p.cfg.Family == 6 {
		r.nfProt, alen = unix.NFPROTO_IPV6, 16
	}
	if err := r.readSets(); err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []dataplane.EndpointCount
	for name, s := range r.sets {
		if !countedMap(name) {
			continue
		}
		service := udataString(s.userdata, byte(userdata.NFTNL_UDATA_SET_COMMENT))
		es, err := r.setElems(name)
		if err != nil {
			if isNotFound(err) {
				continue // deleted since the listing
			}
			return nil, err
		}
		for _, e := range es {
			if !e.counted || e.flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
				continue
			}
			ep, proto, err := countedElem(e, alen)
			if err != nil {
				return nil, fmt.Errorf("nftables: map %s: %w", name, err)
			}
			out = append(out, dataplane.EndpointCount{Service: service, Protocol: proto, Endpoint: ep, NewConnections: e.packets})
		}
	}
	return dataplane.MergeCounts(out), nil
}

// countedElem decodes an element of a counted DNAT map: the key is
// "numgen value . l4proto" (4 bytes each), the value "address . port"
// (the port in a register of its own).
func countedElem(e nlElem, alen int) (netip.AddrPort, dataplane.Protocol, error) {
	if len(e.key) != 8 || len(e.data) != alen+4 {
		return netip.AddrPort{}, "", fmt.Errorf("element of key %d and value %d bytes", len(e.key), len(e.data))
	}
	name, ok := protoNames[e.key[4]]
	if !ok {
		return netip.AddrPort{}, "", fmt.Errorf("protocol %d", e.key[4])
	}
	a, _ := netip.AddrFromSlice(e.data[:alen])
	port := binary.BigEndian.Uint16(e.data[alen : alen+2])
	return netip.AddrPortFrom(a, port), dataplane.Protocol(strings.ToUpper(name)), nil
}
