package nftables

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The typed rule model. render.go and the fixed chains (sync.go) build
// rules as lists of typed statements; each statement spells itself as nft
// text (the knftables transaction) and encodes itself as netlink
// expressions (netlink.go), so neither writer reads the other's output
// and no production code parses rule text. A statement without a netlink
// encoding (the fixed chains', written only with the table through nft)
// says so with errUnsupported, and its transaction goes through nft.

// stmt is one match, statement or verdict of a rule.
type stmt interface {
	// text is the statement as nft spells it in family f.
	text(f fam) string
	// encode appends the statement's expressions as nft 1.0.6 encodes
	// them (TestNetlinkMatchesNft compares the bytecode).
	encode(f fam, out []expr.Any) ([]expr.Any, error)
}

// rule is a rule's statements, in order.
type rule []stmt

func r(s ...stmt) rule { return rule(s) }

// text is the rule as nft spells it.
func (r rule) text(f fam) string {
	if len(r) == 1 {
		return r[0].text(f)
	}
	var b strings.Builder
	for i, s := range r {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s.text(f))
	}
	return b.String()
}

// encode is the rule's netlink expressions.
func (r rule) encode(f fam) ([]expr.Any, error) {
	var out []expr.Any
	for _, s := range r {
		var err error
		if out, err = s.encode(f, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// rulesEqual compares two chains' rules statement by statement.
func rulesEqual(a, b []rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if !stmtEqual(a[i][j], b[i][j]) {
				return false
			}
		}
	}
	return true
}

func stmtEqual(a, b stmt) bool {
	if x, ok := a.(srcRanges); ok {
		y, ok := b.(srcRanges)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	}
	if _, ok := b.(srcRanges); ok {
		return false
	}
	return a == b // every other statement is a comparable value
}

// addrField names the source or destination address of the IP header.
type addrField bool

const (
	saddr addrField = false
	daddr addrField = true
)

func (d addrField) text(f fam) string {
	if d {
		return f.ip + " daddr"
	}
	return f.ip + " saddr"
}

// load loads the address into register 1.
func (d addrField) load(f fam) *expr.Payload {
	off, n := uint32(12), uint32(4)
	if f.v6 {
		off, n = 8, 16
	}
	if d {
		off += n
	}
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

// addrIs: "ip saddr 198.19.1.2".
type addrIs struct {
	field addrField
	addr  netip.Addr
}

func (s addrIs) text(f fam) string { return s.field.text(f) + " " + s.addr.String() }
func (s addrIs) encode(f fam, out []expr.Any) ([]expr.Any, error) {
	if s.addr.Is4() == f.v6 {
		return nil, errUnsupported{"address " + s.addr.String() + " in family " + f.ip}
	}
	return append(out, s.field.load(f), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: s.addr.AsSlice()}), nil
}

// inSet: "ip saddr @cluster-cidrs", or with not "ip saddr != @...".
type inSet struct {
	field addrField
	not   bool
	set   string
}

func (s inSet) text(f fam) string {
	if s.not {
		return s.field.text(f) + " != @" + s.set
	}
	return s.field.text(f) + " @" + s.set
}

func (s inSet) encode(f fam, out []expr.Any) ([]expr.Any, error) {
	return append(out, s.field.load(f), &expr.Lookup{SourceRegister: 1, SetName: s.set, Invert: s.not}), nil
}

// srcRanges: "ip saddr { 198.19.128.0/24, ... }" (loadBalancerSourceRanges;
// an anonymous set, which only nft writes).
type srcRanges []netip.Prefix

func (s srcRanges) text(f fam) string {
	rs := make([]string, len(s))
	for i, p := range s {
		rs[i] = p.String()
	}
	return f.ip + " saddr { " + strings.Join(rs, ", ") + " }"
}

func (s srcRanges) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"anonymous set"}
}

// l4proto: "meta l4proto tcp".
type l4proto uint8

func (s l4proto) text(fam) string { return "meta l4proto " + protoName(uint8(s)) }
func (s l4proto) encode(_ fam, out []expr.Any) ([]expr.Any, error) {
	return append(out, metaL4proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(s)}}), nil
}

// dport: "tcp dport 80" (nft adds the protocol check).
type dport struct {
	proto uint8
	port  uint16
}

func (s dport) text(fam) string {
	return protoName(s.proto) + " dport " + strconv.Itoa(int(s.port))
}

func (s dport) encode(f fam, out []expr.Any) ([]expr.Any, error) {
	out, _ = l4proto(s.proto).encode(f, out)
	return append(out,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, s.port)}), nil
}

// verdict: "jump c", "goto c", "return", "drop".
type verdict struct {
	kind  expr.VerdictKind
	chain string
}

func jump(c string) verdict { return verdict{expr.VerdictJump, c} }
func goTo(c string) verdict { return verdict{expr.VerdictGoto, c} }

var (
	vDrop   = verdict{kind: expr.VerdictDrop}
	vReturn = verdict{kind: expr.VerdictReturn}
)

func (v verdict) text(fam) string {
	switch v.kind {
	case expr.VerdictJump:
		return "jump " + v.chain
	case expr.VerdictGoto:
		return "goto " + v.chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictAccept:
		return "accept"
	}
	return "verdict " + strconv.Itoa(int(v.kind))
}

// encode: jumps and gotos only (the others end the fixed chains' rules,
// which nft writes).
func (v verdict) encode(_ fam, out []expr.Any) ([]expr.Any, error) {
	if v.kind != expr.VerdictJump && v.kind != expr.VerdictGoto {
		return nil, errUnsupported{"verdict " + v.text(fam{})}
	}
	return append(out, &expr.Verdict{Kind: v.kind, Chain: v.chain}), nil
}

// dnatTo: "dnat to 198.19.1.2:8080" (after an l4proto match).
type dnatTo netip.AddrPort

func (s dnatTo) text(fam) string { return "dnat to " + netip.AddrPort(s).String() }
func (s dnatTo) encode(f fam, out []expr.Any) ([]expr.Any, error) {
	ap := netip.AddrPort(s)
	if ap.Addr().Is4() == f.v6 {
		return nil, errUnsupported{"dnat target " + ap.String()}
	}
	return append(out,
		&expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, ap.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto(), RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}), nil
}

// numgenKey encodes the key "numgen random mod N offset K" of the weight
// maps. nft turns the draw to network order for the interval map (its
// keys are stored big endian); without the byteorder step the lookup
// misses (listings do not show it: "nft --debug=netlink" does, and
// TestNetlinkMatchesNft compares that). The offset moves a port's draws
// into its own range of a weight map that several ports share. One field,
// not "numgen . meta l4proto": see weightmaps.go for why.
func numgenKey(mod, off uint32, out []expr.Any) []expr.Any {
	return append(out,
		&expr.Numgen{Register: 1, Modulus: mod, Type: unix.NFT_NG_RANDOM, Offset: off},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4})
}

// numgenText is "numgen random mod N", with " offset K" when K is not 0
// (nft omits it then).
func numgenText(mod, off uint32) string {
	t := "numgen random mod " + strconv.FormatUint(uint64(mod), 10)
	if off != 0 {
		t += " offset " + strconv.FormatUint(uint64(off), 10)
	}
	return t
}

// numgenVmap: "numgen random mod N offset K vmap @wv-..."
// (ClientIP affinity: the map sends to endpoint chains).
type numgenVmap struct {
	mod, off uint32
	m        string
}

func (s numgenVmap) text(fam) string {
	return numgenText(s.mod, s.off) + " vmap @" + s.m
}

func (s numgenVmap) encode(_ fam, out []expr.Any) ([]expr.Any, error) {
	out = numgenKey(s.mod, s.off, out)
	return append(out, &expr.Lookup{SourceRegister: 1, SetName: s.m, IsDestRegSet: true, DestRegister: 0}), nil
}

// numgenDNAT: "dnat ip to numgen random mod N offset K map @dn-..." (after
// an l4proto match). The map's value (address . port)
// lands in register 1 and after it: the port in NFT_REG32_01 (9) after an
// IPv4 address, in the second 128-bit register (2) after an IPv6 one, as
// nft --debug=netlink shows.
type numgenDNAT struct {
	mod, off uint32
	m        string
}

func (s numgenDNAT) text(f fam) string {
	return "dnat " + f.ip + " to " + numgenText(s.mod, s.off) + " map @" + s.m
}

func (s numgenDNAT) encode(f fam, out []expr.Any) ([]expr.Any, error) {
	out = numgenKey(s.mod, s.off, out)
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto(), RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 9, RegProtoMax: 9, Specified: true}
	if f.v6 {
		nat.RegProtoMin, nat.RegProtoMax = 2, 2
	}
	return append(out, &expr.Lookup{SourceRegister: 1, SetName: s.m, IsDestRegSet: true, DestRegister: 1}, nat), nil
}

// nftOnly is a statement that only nft writes: those of the fixed chains
// (the hairpin lookup, marks, masquerade, reject, ct state, fib, the
// affinity update), which go to the kernel with the table and base chains
// in an nft transaction. The text is written, never read back.
type nftOnly string

func (s nftOnly) text(fam) string { return string(s) }
func (s nftOnly) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"statement " + string(s)}
}

// fibLocal: "fib saddr type local".
const fibLocal = nftOnly("fib saddr type local")

// updateSaddr: "update @af-... { ip saddr }" (ClientIP affinity).
type updateSaddr string

func (s updateSaddr) text(f fam) string { return "update @" + string(s) + " { " + f.ip + " saddr }" }
func (s updateSaddr) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"set update"}
}

// The fixed chains' statements that Explain reads back from the kernel
// (masqueradeProblem): written only by nft, recognised by decodeRule.

// markSet: "meta mark set meta mark | 0x4000", with xor "... ^ 0x4000".
type markSet struct {
	xor  bool
	mark uint32
}

func (s markSet) text(fam) string {
	op := " | "
	if s.xor {
		op = " ^ "
	}
	return "meta mark set meta mark" + op + "0x" + strconv.FormatUint(uint64(s.mark), 16)
}

func (s markSet) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"statement " + s.text(fam{})}
}

// masquerade: "masquerade fully-random".
type masquerade struct{}

func (masquerade) text(fam) string { return "masquerade fully-random" }
func (masquerade) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"masquerade"}
}

// hairpinMatch: "ct status dnat ip daddr . meta l4proto . th dport . ip
// saddr @hairpin" (hairpin.go).
type hairpinMatch struct{}

func (hairpinMatch) text(f fam) string {
	return "ct status dnat " + f.ip + " daddr . meta l4proto . th dport . " + f.ip + " saddr @" + setHairpin
}

func (hairpinMatch) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"hairpin match"}
}

// opaque is what decodeRule makes of expressions that are no statement
// of the model (the fixed chains' reject, ct state, vmap lookups, or
// anything another writer put there): the expressions' names. Never
// written; Explain finds nothing it follows in it.
type opaque string

func (s opaque) text(fam) string { return "unknown: " + string(s) }
func (s opaque) encode(fam, []expr.Any) ([]expr.Any, error) {
	return nil, errUnsupported{"expressions " + string(s)}
}

func metaL4proto(reg uint32) *expr.Meta { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }

// protoName is the name nft prints for an IP protocol number.
func protoName(p uint8) string {
	if n, ok := protoNames[p]; ok {
		return n
	}
	return strconv.Itoa(int(p))
}

// protoNames are the names nft prints for the protocols steelyard serves.
var protoNames = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// protoNumbers are their numbers by name.
var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}
