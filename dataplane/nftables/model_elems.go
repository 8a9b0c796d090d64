package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// The typed elements of the model: the shared maps' (svcKey -> verdict),
// the weight maps' (numgen range -> endpoint or verdict) and the hairpin
// set's (hairpinKey). Each spells itself for knftables and encodes itself
// for netlink.

// setElem is an element of one of steelyard's typed sets or maps.
type setElem interface {
	// set is the set's or map's name, and whether it is a map.
	set() (string, bool)
	// knft is the element for a knftables transaction (value and comment
	// only when add).
	knft(f fam, add bool) *knftables.Element
	// netlink is the element as nft 1.0.6 encodes it: one kernel element,
	// or two for a range of a single-field interval map (its start and
	// its end, mapElem).
	netlink(f fam, add bool) ([]gnft.SetElement, error)
}

// svcKey is the key of a shared map: "address . protocol . port" in
// service-ips and no-endpoint-services, "protocol . port" (no address) in
// the node port maps.
type svcKey struct {
	addr  netip.Addr
	proto uint8
	port  uint16
}

func (k svcKey) fields() []string {
	out := make([]string, 0, 3)
	if k.addr.IsValid() {
		out = append(out, k.addr.String())
	}
	return append(out, protoName(k.proto), strconv.Itoa(int(k.port)))
}

// bytes: each field padded to its 32-bit register.
func (k svcKey) bytes() []byte {
	var out []byte
	if k.addr.IsValid() {
		out = k.addr.AsSlice()
	}
	return append(append(out, pad4([]byte{k.proto})...), pad4(binary.BigEndian.AppendUint16(nil, k.port))...)
}

func (k svcKey) compare(o svcKey) int {
	if c := k.addr.Compare(o.addr); c != 0 {
		return c
	}
	if k.proto != o.proto {
		return int(k.proto) - int(o.proto)
	}
	return int(k.port) - int(o.port)
}

// elem is one element of a shared map, owned by one Service port.
type elem struct {
	m   string // map name
	key svcKey
	to  verdict
	// kind is the comment suffix naming the entry point ("" for the
	// clusterIP); explain reads it back.
	kind string
}

// elemID identifies a shared element: its map and key.
type elemID struct {
	m   string
	key svcKey
}

func (e elem) id() elemID { return elemID{e.m, e.key} }

func (a elemID) compare(b elemID) int {
	if c := strings.Compare(a.m, b.m); c != 0 {
		return c
	}
	return a.key.compare(b.key)
}

func (a elemID) String() string { return a.m + " " + strings.Join(a.key.fields(), " . ") }

// sharedElem is a shared map element as written, with its comment.
type sharedElem struct {
	e       elem
	comment *string
}

func (s sharedElem) set() (string, bool) { return s.e.m, true }

func (s sharedElem) knft(f fam, add bool) *knftables.Element {
	el := &knftables.Element{Map: s.e.m, Key: s.e.key.fields()}
	if add {
		el.Comment = s.comment
		el.Value = []string{s.e.to.text(f)}
	}
	return el
}

func (s sharedElem) netlink(f fam, add bool) ([]gnft.SetElement, error) {
	if s.e.key.addr.IsValid() && s.e.key.addr.Is4() == f.v6 {
		return nil, errUnsupported{"key " + s.e.id().String()}
	}
	el := gnft.SetElement{Key: s.e.key.bytes()}
	if !add {
		return []gnft.SetElement{el}, nil
	}
	switch s.e.to.kind {
	case expr.VerdictJump, expr.VerdictGoto, expr.VerdictDrop:
		el.VerdictData = &expr.Verdict{Kind: s.e.to.kind, Chain: s.e.to.chain}
	default:
		return nil, errUnsupported{"map value " + s.e.to.text(f)}
	}
	if s.comment != nil {
		if err := commentFits(*s.comment); err != nil {
			return nil, err
		}
		el.Comment = *s.comment
	}
	return []gnft.SetElement{el}, nil
}

// wmElem is one element of a weight map: the numgen range lo-hi goes to
// an endpoint (DNAT maps) or to a verdict (the verdict maps of ClientIP
// affinity: "goto ep-...", or "return" for the reject share).
type wmElem struct {
	lo, hi uint32
	dnat   netip.AddrPort // valid in a DNAT map
	to     verdict
}

// value is the element's value as nft spells it.
func (e wmElem) value(f fam) []string {
	if e.dnat.IsValid() {
		return []string{e.dnat.Addr().String(), strconv.Itoa(int(e.dnat.Port()))}
	}
	return []string{e.to.text(f)}
}

// weightMap is a Service port's map from numgen ranges to endpoints: a
// DNAT map (values "198.19.1.2 . 8080") or, with ClientIP affinity, a
// verdict map to endpoint chains ("goto ep-...").
type weightMap struct {
	dnat  bool
	proto uint8 // the key's second field
	elems []wmElem
}

// data is the type of the values in the map's typeof.
func (m *weightMap) data(f fam) string {
	if m.dnat {
		return f.ip + " daddr . " + protoName(m.proto) + " dport"
	}
	return "verdict"
}

// mapElem is an element of weight map m as written (e points into the
// rendered weightMap: no copy per queued element).
type mapElem struct {
	m     string
	proto uint8
	e     *wmElem
}

func (s mapElem) set() (string, bool) { return s.m, true }

func (s mapElem) knft(f fam, add bool) *knftables.Element {
	el := &knftables.Element{Map: s.m, Key: []string{fmt.Sprintf("%d-%d", s.e.lo, s.e.hi)}}
	if add {
		el.Value = s.e.value(f)
	}
	return el
}

// netlink: the range lo-hi of a single-field interval map is two elements
// of the kernel's rbtree, as nft 1.0.6 sends them ("nft --debug=netlink
// add element"): the start, key lo (numgen's value big endian) with the
// value, and the end, key hi+1 flagged NFT_SET_ELEM_INTERVAL_END (none
// when hi is the last draw: the range is open to the end). A lookup
// takes the greatest element not above the draw and misses on an end, so
// a draw in a gap (another port's free slot, the reject share) misses.
// Adjacent ranges give two elements with one key, an end and a start:
// the kernel keeps both, and deleting one range (its start and its end,
// the flag included) leaves its neighbour's start. nft also sends an end
// at 0 before the first range of each command; it changes no lookup and
// no steelyard range owns it, so it is not sent here.
func (s mapElem) netlink(f fam, add bool) ([]gnft.SetElement, error) {
	start := gnft.SetElement{Key: binary.BigEndian.AppendUint32(nil, s.e.lo)}
	var end []gnft.SetElement
	if s.e.hi != ^uint32(0) {
		end = []gnft.SetElement{{Key: binary.BigEndian.AppendUint32(nil, s.e.hi+1), IntervalEnd: true}}
	}
	if !add {
		return append([]gnft.SetElement{start}, end...), nil
	}
	switch {
	case s.e.dnat.IsValid():
		a := s.e.dnat.Addr()
		if a.Is4() == f.v6 {
			return nil, errUnsupported{"DNAT map value " + s.e.dnat.String()}
		}
		start.Val = append(a.AsSlice(), pad4(binary.BigEndian.AppendUint16(nil, s.e.dnat.Port()))...)
	case s.e.to.kind == expr.VerdictJump || s.e.to.kind == expr.VerdictGoto || s.e.to.kind == expr.VerdictDrop || s.e.to.kind == expr.VerdictReturn:
		// "return" is the reject share of an affinity port: over netlink
		// too, so no element goes through nft, which reads every plain
		// interval map of the table first.
		start.VerdictData = &expr.Verdict{Kind: s.e.to.kind, Chain: s.e.to.chain}
	default:
		return nil, errUnsupported{"map value " + s.e.to.text(f)}
	}
	return append([]gnft.SetElement{start}, end...), nil
}

func (k hairpinKey) set() (string, bool) { return setHairpin, false }

func (k hairpinKey) knft(fam, bool) *knftables.Element {
	return &knftables.Element{Set: setHairpin, Key: k.fields()}
}

// netlink: "address . proto . port . address", each field in its register.
func (k hairpinKey) netlink(f fam, _ bool) ([]gnft.SetElement, error) {
	a := netip.AddrFrom16(k.addr).Unmap()
	if a.Is4() == f.v6 {
		return nil, errUnsupported{"hairpin key " + a.String()}
	}
	key := append(a.AsSlice(), pad4([]byte{k.proto})...)
	key = append(key, pad4(binary.BigEndian.AppendUint16(nil, k.port))...)
	return []gnft.SetElement{{Key: append(key, a.AsSlice()...)}}, nil
}

// pad4 pads a concatenation field to its 32-bit register.
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// decodeSvcKey reads a shared map's key from the kernel.
func decodeSvcKey(name string, k []byte, alen int) (svcKey, error) {
	var key svcKey
	if name == mapServiceIPs || name == mapNoEndpointServices {
		if len(k) != alen+8 {
			return key, fmt.Errorf("map %s: key of %d bytes", name, len(k))
		}
		key.addr, _ = netip.AddrFromSlice(k[:alen])
		k = k[alen:]
	}
	if len(k) != 8 {
		return key, fmt.Errorf("map %s: key of %d bytes", name, len(k))
	}
	key.proto, key.port = k[0], binary.BigEndian.Uint16(k[4:6])
	return key, nil
}

// parseSvcKey reads a shared map's key as nft lists it (the knftables
// listing where netlink is not used: the fake of the unit tests).
func parseSvcKey(name string, fields []string) (svcKey, error) {
	var key svcKey
	if name == mapServiceIPs || name == mapNoEndpointServices {
		if len(fields) != 3 {
			return key, fmt.Errorf("map %s: key %q", name, fields)
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil {
			return key, fmt.Errorf("map %s: key %q", name, fields)
		}
		key.addr, fields = a, fields[1:]
	}
	if len(fields) != 2 {
		return key, fmt.Errorf("map %s: key %q", name, fields)
	}
	p, ok := protoNumbers[fields[0]]
	if !ok {
		n, err := strconv.ParseUint(fields[0], 10, 8)
		if err != nil {
			return key, fmt.Errorf("map %s: key %q", name, fields)
		}
		p = uint8(n)
	}
	port, err := strconv.ParseUint(fields[1], 10, 16)
	if err != nil {
		return key, fmt.Errorf("map %s: key %q", name, fields)
	}
	key.proto, key.port = p, uint16(port)
	return key, nil
}

// parseVerdict reads a verdict as nft lists it ("goto c", "drop").
func parseVerdict(s string) verdict {
	kind, chain, _ := strings.Cut(strings.TrimSpace(s), " ")
	switch kind {
	case "goto":
		return goTo(chain)
	case "jump":
		return jump(chain)
	case "drop":
		return vDrop
	case "return":
		return vReturn
	case "accept":
		return verdict{kind: expr.VerdictAccept}
	}
	return verdict{kind: -100, chain: s} // unknown: differs from every verdict steelyard writes
}

// decodeVerdict reads the verdict data of a map element from the kernel.
func decodeVerdict(b []byte) (verdict, error) {
	// Netlink attributes: length and type (host order, 16 bits each),
	// then the data, padded to 4 bytes.
	var v verdict
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < 4 || n > len(b) {
			return v, fmt.Errorf("bad verdict attribute")
		}
		data := b[4:n]
		switch typ {
		case unix.NFTA_VERDICT_CODE:
			if len(data) == 4 {
				v.kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(data)))
			}
		case unix.NFTA_VERDICT_CHAIN:
			v.chain = strings.TrimRight(string(data), "\x00")
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return v, nil
}

// verdictText spells the verdict data of a map element as nft does.
func verdictText(b []byte) (string, error) {
	v, err := decodeVerdict(b)
	if err != nil {
		return "", err
	}
	return v.text(fam{}), nil
}

func sortedIDs[V any](m map[elemID]V) []elemID {
	out := make([]elemID, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, elemID.compare)
	return out
}
