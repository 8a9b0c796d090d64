package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Counting new connections per endpoint (issue 23). With CountConnections
// each DNAT map ("kc-"/"kl-") carries a counter on every element: the
// lookup that picks an endpoint's numgen range bumps that element's
// counter, and nat chains see only the first packet of a connection, so
// its packet count is the endpoint's count of new connections. No rule,
// chain or object is added per endpoint. An element is rewritten, and its
// count restarts, when its Service port's split changes (an endpoint comes
// or goes, a weight changes: the numgen ranges move) or a full sync finds
// the map differs from what it wrote; counts of the Service ports that did
// not change are kept. Ports with ClientIP affinity are not counted.

// Counts implements dataplane.Dataplane: one netlink dump of the table's
// sets (a counted map's comment names its Service port and protocol),
// then one of each counted map's elements (google/nftables decodes each
// element's counter; only a range's start element counts).
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	if p.netlink == nil {
		return nil, nil // a fake kernel has no counters
	}
	c, err := gnft.New(gnft.AsLasting())
	if err != nil {
		return nil, err
	}
	defer c.CloseLasting() //nolint:errcheck // read-only
	table := p.netlink.table
	alen := 4
	if p.cfg.Family == 6 {
		alen = 16
	}
	sets, err := setComments(p.f)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	var out []dataplane.EndpointCount
	for name, comment := range sets {
		if !countedMap(name) {
			continue
		}
		service, proto, ok := countedComment(comment)
		if !ok {
			return nil, fmt.Errorf("nftables: map %s: comment %q", name, comment)
		}
		es, err := c.GetSetElements(&gnft.Set{Table: table, Name: name})
		if err != nil {
			if isNotFound(err) {
				continue // deleted since the listing
			}
			return nil, err
		}
		for _, e := range es {
			// A range's end element has no value and no counter.
			if e.Counter == nil || e.IntervalEnd {
				continue
			}
			ep, err := countedElem(e, alen)
			if err != nil {
				return nil, fmt.Errorf("nftables: map %s: %w", name, err)
			}
			out = append(out, dataplane.EndpointCount{Service: service, Protocol: proto, Endpoint: ep, NewConnections: e.Counter.Packets})
		}
	}
	return dataplane.MergeCounts(out), nil
}

// countedComment reads a counted map's comment, "namespace/name:port
// tcp": the Service port and its protocol.
func countedComment(c string) (string, dataplane.Protocol, bool) {
	i := strings.LastIndexByte(c, ' ')
	if i < 0 {
		return "", "", false
	}
	if _, ok := protoNumbers[c[i+1:]]; !ok {
		return "", "", false
	}
	return c[:i], dataplane.Protocol(strings.ToUpper(c[i+1:])), true
}

// countedElem decodes the start element of a range of a counted DNAT map:
// the key is the draw (4 bytes), the value "address . port" (the port in
// a register of its own).
func countedElem(e gnft.SetElement, alen int) (netip.AddrPort, error) {
	if len(e.Key) != 4 || len(e.Val) != alen+4 {
		return netip.AddrPort{}, fmt.Errorf("element of key %d and value %d bytes", len(e.Key), len(e.Val))
	}
	a, _ := netip.AddrFromSlice(e.Val[:alen])
	port := binary.BigEndian.Uint16(e.Val[alen : alen+2])
	return netip.AddrPortFrom(a, port), nil
}

// setComments reads the table's sets and their comments (the Service port
// of a counted map) in one dump. google/nftables v0.3.0's GetSets does
// not decode a set's comment, so this is the adapter: each set's name and
// user data, the comment read with its userdata package.
func setComments(f fam) (map[string]string, error) {
	c, err := netlinkDial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	replies, err := c.get(uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSET), true, byte(f.nfproto()),
		[]nlAttr{{unix.NFTA_SET_TABLE, append([]byte(TableName), 0)}})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(replies))
	for _, b := range replies {
		name := strings.TrimRight(string(attrGet(b, unix.NFTA_SET_NAME)), "\x00")
		out[name], _ = userdata.GetString(attrGet(b, unix.NFTA_SET_USERDATA), userdata.NFTNL_UDATA_SET_COMMENT)
	}
	return out, nil
}
