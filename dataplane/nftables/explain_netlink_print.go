package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// printer spells rules and elements as nft 1.0.6 lists them, for the rule
// shapes steelyard writes (skeleton, render, localhost, the netlink
// writer) and the split that DNATs through a data map.
type printer struct {
	family   int
	set      func(name string) *nlSet
	elements func(name string) ([]nlElem, error)
}

// refs are the chains and named sets a rule names.
type refs struct{ chains, sets []string }

// Kinds of what a register holds.
const (
	fAddr     = iota + 1 // ip saddr/daddr (bits: the prefix matched)
	fProto               // meta l4proto
	fPort                // th dport / th sport
	fNumgen              // numgen random mod N
	fMark                // meta mark, op "", "|", "&" or "^"
	fCtState             // ct state
	fCtStatus            // ct status
	fFib                 // fib saddr type
	fImm                 // immediate data
	fMapData             // what a data map lookup returned
)

type field struct {
	kind int
	text string
	size int
	bits int    // fAddr: prefix length matched, -1: the whole address
	op   string // fMark, fCt*: bitwise applied
	val  uint32 // fMark, fCt*: the operand
	hton bool
	data []byte
	set  *nlSet
}

// regOff is where register r starts in the 64-byte register file: the
// four 16-byte registers (1-4) and the sixteen 32-bit ones (8-23) overlap.
func regOff(r uint32) (int, bool) {
	switch {
	case r >= unix.NFT_REG_1 && r <= unix.NFT_REG_4:
		return int(r-unix.NFT_REG_1) * 16, true
	case r >= unix.NFT_REG32_00 && r <= unix.NFT_REG32_15:
		return int(r-unix.NFT_REG32_00) * 4, true
	}
	return 0, false
}

func pad4n(n int) int { return (n + 3) &^ 3 }

func (pr printer) ip() string { return famOf(pr.family).ip }

func (pr printer) addrLen() int {
	if pr.family == 6 {
		return 16
	}
	return 4
}

// rule prints one rule as nft lists it, with its comment; an unknown
// sequence prints as "unknown: <names>", which none of explain's patterns
// match.
func (pr printer) rule(exprs []nlExpr, udata []byte) (string, refs) {
	text, rf := pr.ruleText(exprs)
	if c := udataString(udata, udataRuleComment); c != "" {
		text += ` comment "` + c + `"`
	}
	return text, rf
}

// ruleText is rule without the comment (as explain's snapshot keeps it).
func (pr printer) ruleText(exprs []nlExpr) (string, refs) {
	text, rf, err := pr.stmts(exprs)
	if err != nil {
		names := make([]string, len(exprs))
		for i, e := range exprs {
			names[i] = e.name
		}
		return "unknown: " + strings.Join(names, " ") + " (" + err.Error() + ")", refs{}
	}
	return text, rf
}

func (pr printer) stmts(exprs []nlExpr) (string, refs, error) {
	var out []string
	var rf refs
	regs := map[int]*field{}
	dep, depProto := -1, "" // a "meta l4proto X" that a later statement may absorb
	load := func(reg uint32, f *field) error {
		off, ok := regOff(reg)
		if !ok {
			return fmt.Errorf("register %d", reg)
		}
		for o := range regs {
			if o < off+f.size && off < o+regs[o].size {
				return errors.New("register overwritten unread")
			}
		}
		regs[off] = f
		return nil
	}
	take := func(reg uint32) (*field, int, error) {
		off, ok := regOff(reg)
		if f := regs[off]; ok && f != nil {
			return f, off, nil
		}
		return nil, 0, fmt.Errorf("register %d unset", reg)
	}
	// key reads a lookup key of n bytes from reg on: one field, or the
	// fields of a concatenation, each in its own 32-bit slots.
	key := func(reg uint32, s *nlSet) (string, []*field, error) {
		off, ok := regOff(reg)
		if !ok {
			return "", nil, fmt.Errorf("register %d", reg)
		}
		var parts []string
		var fs []*field
		for left := int(s.keyLen); left > 0; {
			f := regs[off]
			if f == nil || f.op != "" || (f.kind == fAddr && f.bits >= 0) || f.kind == fImm || f.kind == fMapData || f.kind == fMark || f.kind == fFib {
				return "", nil, errors.New("lookup key")
			}
			step := f.size
			if s.concatFlag() || int(s.keyLen) > f.size {
				step = pad4n(f.size)
			}
			// nft turns numgen and l4proto to network order for interval
			// maps only; without that the lookup misses.
			if (f.kind == fNumgen || f.kind == fProto) && f.hton != s.interval() {
				return "", nil, errors.New("byteorder of a lookup key")
			}
			// After "meta l4proto tcp" nft would print the port as
			// "tcp dport"; not a shape steelyard writes, so not guessed.
			if f.kind == fPort && dep >= 0 && dep == len(out)-1 {
				return "", nil, errors.New("port key after its protocol")
			}
			parts = append(parts, f.text)
			fs = append(fs, f)
			delete(regs, off)
			left -= step
			off += step
			if left < 0 {
				return "", nil, errors.New("lookup key length")
			}
		}
		return strings.Join(parts, " . "), fs, nil
	}
	for _, e := range exprs {
		var err error
		switch e.name {
		case "payload":
			err = pr.payload(e, load)
		case "meta":
			if reg, ok := e.u32(unix.NFTA_META_SREG); ok {
				k, _ := e.u32(unix.NFTA_META_KEY)
				f, _, terr := take(reg)
				if terr != nil || !e.only(unix.NFTA_META_SREG, unix.NFTA_META_KEY) || k != unix.NFT_META_MARK || f.kind != fMark || (f.op != "|" && f.op != "^") {
					return "", rf, errors.New("meta set")
				}
				off, _ := regOff(reg)
				delete(regs, off)
				out = append(out, "meta mark set "+f.text)
				break
			}
			k, _ := e.u32(unix.NFTA_META_KEY)
			reg, _ := e.u32(unix.NFTA_META_DREG)
			switch {
			case !e.only(unix.NFTA_META_DREG, unix.NFTA_META_KEY):
				err = errors.New("meta")
			case k == unix.NFT_META_L4PROTO:
				err = load(reg, &field{kind: fProto, text: "meta l4proto", size: 1, bits: -1})
			case k == unix.NFT_META_MARK:
				err = load(reg, &field{kind: fMark, text: "meta mark", size: 4, bits: -1})
			default:
				err = fmt.Errorf("meta key %d", k)
			}
		case "numgen":
			reg, _ := e.u32(unix.NFTA_NG_DREG)
			mod, _ := e.u32(unix.NFTA_NG_MODULUS)
			typ, _ := e.u32(unix.NFTA_NG_TYPE)
			offset, _ := e.u32(unix.NFTA_NG_OFFSET)
			if !e.only(unix.NFTA_NG_DREG, unix.NFTA_NG_MODULUS, unix.NFTA_NG_TYPE, unix.NFTA_NG_OFFSET) || typ != unix.NFT_NG_RANDOM || offset != 0 {
				return "", rf, errors.New("numgen")
			}
			err = load(reg, &field{kind: fNumgen, text: fmt.Sprintf("numgen random mod %d", mod), size: 4, bits: -1})
		case "byteorder":
			sreg, _ := e.u32(unix.NFTA_BYTEORDER_SREG)
			dreg, _ := e.u32(unix.NFTA_BYTEORDER_DREG)
			op, _ := e.u32(unix.NFTA_BYTEORDER_OP)
			n, _ := e.u32(unix.NFTA_BYTEORDER_LEN)
			size, _ := e.u32(unix.NFTA_BYTEORDER_SIZE)
			f, _, terr := take(sreg)
			ok := terr == nil && sreg == dreg && op == unix.NFT_BYTEORDER_HTON && !f.hton &&
				(f.kind == fNumgen && size == 4 && n == 4 || f.kind == fProto && size == 2 && n == 1)
			if !ok {
				return "", rf, errors.New("byteorder")
			}
			f.hton = true
		case "ct":
			reg, _ := e.u32(unix.NFTA_CT_DREG)
			k, _ := e.u32(unix.NFTA_CT_KEY)
			switch {
			case !e.only(unix.NFTA_CT_DREG, unix.NFTA_CT_KEY):
				err = errors.New("ct")
			case k == unix.NFT_CT_STATE:
				err = load(reg, &field{kind: fCtState, text: "ct state", size: 4, bits: -1})
			case k == unix.NFT_CT_STATUS:
				err = load(reg, &field{kind: fCtStatus, text: "ct status", size: 4, bits: -1})
			default:
				err = fmt.Errorf("ct key %d", k)
			}
		case "fib":
			reg, _ := e.u32(unix.NFTA_FIB_DREG)
			res, _ := e.u32(unix.NFTA_FIB_RESULT)
			fl, _ := e.u32(unix.NFTA_FIB_FLAGS)
			if !e.only(unix.NFTA_FIB_DREG, unix.NFTA_FIB_RESULT, unix.NFTA_FIB_FLAGS) || res != unix.NFT_FIB_RESULT_ADDRTYPE || fl != unix.NFTA_FIB_F_SADDR {
				return "", rf, errors.New("fib")
			}
			err = load(reg, &field{kind: fFib, text: "fib saddr type", size: 4, bits: -1})
		case "bitwise":
			err = pr.bitwise(e, take)
		case "cmp":
			var s string
			var absorb bool
			s, absorb, err = pr.cmp(e, take, regs)
			switch {
			case err != nil:
			case absorb:
				// "meta l4proto tcp" + "th dport 80" print as "tcp dport 80"
				if dep < 0 || dep != len(out)-1 || !slices.Contains([]string{"tcp", "udp", "sctp"}, depProto) {
					return "", rf, errors.New("port without its protocol")
				}
				out[dep], dep = depProto+" "+s, -1
			case strings.HasPrefix(s, "meta l4proto "):
				dep, depProto = len(out), strings.TrimPrefix(s, "meta l4proto ")
				out = append(out, s)
			default:
				out = append(out, s)
			}
		case "lookup":
			reg, _ := e.u32(unix.NFTA_LOOKUP_SREG)
			name := strings.TrimRight(string(e.attrs.get(unix.NFTA_LOOKUP_SET)), "\x00")
			fl, _ := e.u32(unix.NFTA_LOOKUP_FLAGS)
			dreg, hasDreg := e.u32(unix.NFTA_LOOKUP_DREG)
			s := pr.set(name)
			if s == nil || !e.only(unix.NFTA_LOOKUP_SREG, unix.NFTA_LOOKUP_SET, unix.NFTA_LOOKUP_SET_ID, unix.NFTA_LOOKUP_DREG, unix.NFTA_LOOKUP_FLAGS) || fl&^unix.NFT_LOOKUP_F_INV != 0 {
				return "", rf, errors.New("lookup")
			}
			inv := fl&unix.NFT_LOOKUP_F_INV != 0
			k, fs, kerr := key(reg, s)
			if kerr != nil {
				return "", rf, kerr
			}
			switch {
			case !hasDreg && s.anonymous():
				body, berr := pr.anonymous(s, fs)
				if berr != nil {
					return "", rf, berr
				}
				if inv {
					k += " !="
				}
				out = append(out, k+" { "+body+" }")
			case !hasDreg:
				if inv {
					k += " !="
				}
				out = append(out, k+" @"+name)
				rf.sets = append(rf.sets, name)
			case inv || s.anonymous() || !s.isMap():
				return "", rf, errors.New("map lookup")
			case dreg == unix.NFT_REG_VERDICT && s.verdictMap():
				out = append(out, k+" vmap @"+name)
				rf.sets = append(rf.sets, name)
			case dreg != unix.NFT_REG_VERDICT && !s.verdictMap():
				err = load(dreg, &field{kind: fMapData, text: k + " map @" + name, size: int(s.dataLen), bits: -1, set: s})
				rf.sets = append(rf.sets, name)
			default:
				return "", rf, errors.New("map lookup")
			}
		case "immediate":
			reg, _ := e.u32(unix.NFTA_IMMEDIATE_DREG)
			val, verdict, derr := dataValue(e.attrs.get(unix.NFTA_IMMEDIATE_DATA))
			if derr != nil || !e.only(unix.NFTA_IMMEDIATE_DREG, unix.NFTA_IMMEDIATE_DATA) {
				return "", rf, errors.New("immediate")
			}
			if reg == unix.NFT_REG_VERDICT {
				v, verr := verdictText(verdict)
				if verr != nil || strings.HasPrefix(v, "verdict ") {
					return "", rf, errors.New("verdict")
				}
				if c := verdictChain(v); c != "" {
					rf.chains = append(rf.chains, c)
				}
				out = append(out, v)
				break
			}
			err = load(reg, &field{kind: fImm, size: len(val), bits: -1, data: val})
		case "nat":
			var s string
			s, err = pr.nat(e, take, regs)
			out = append(out, s)
		case "masq":
			fl, _ := e.u32(unix.NFTA_MASQ_FLAGS)
			switch {
			case !e.only(unix.NFTA_MASQ_FLAGS):
				err = errors.New("masq")
			case fl == 0:
				out = append(out, "masquerade")
			case fl == natRangeRandomFully:
				out = append(out, "masquerade fully-random")
			default:
				err = errors.New("masq flags")
			}
		case "reject":
			typ, _ := e.u32(unix.NFTA_REJECT_TYPE)
			code := e.attrs.get(unix.NFTA_REJECT_ICMP_CODE)
			port := byte(3) // ICMP port unreachable
			if pr.family == 6 {
				port = 4 // ICMPv6 port unreachable
			}
			switch {
			case !e.only(unix.NFTA_REJECT_TYPE, unix.NFTA_REJECT_ICMP_CODE):
				err = errors.New("reject")
			case typ == unix.NFT_REJECT_ICMP_UNREACH && len(code) == 1 && code[0] == port:
				out = append(out, "reject")
			case typ == unix.NFT_REJECT_TCP_RST && dep == len(out)-1 && depProto == "tcp":
				out[dep], dep = "reject with tcp reset", -1
			default:
				err = errors.New("reject type")
			}
		case "counter":
			pk, bt := e.attrs.get(unix.NFTA_COUNTER_PACKETS), e.attrs.get(unix.NFTA_COUNTER_BYTES)
			if !e.only(unix.NFTA_COUNTER_PACKETS, unix.NFTA_COUNTER_BYTES, unix.NFTA_COUNTER_PAD) || len(pk) != 8 || len(bt) != 8 {
				return "", rf, errors.New("counter")
			}
			out = append(out, fmt.Sprintf("counter packets %d bytes %d", binary.BigEndian.Uint64(pk), binary.BigEndian.Uint64(bt)))
		case "dynset":
			name := strings.TrimRight(string(e.attrs.get(unix.NFTA_DYNSET_SET_NAME)), "\x00")
			op, _ := e.u32(unix.NFTA_DYNSET_OP)
			reg, _ := e.u32(unix.NFTA_DYNSET_SREG_KEY)
			fl, _ := e.u32(unix.NFTA_DYNSET_FLAGS)
			to := e.attrs.get(unix.NFTA_DYNSET_TIMEOUT)
			s := pr.set(name)
			if s == nil || op != unix.NFT_DYNSET_OP_UPDATE || fl != 0 || (to != nil && (len(to) != 8 || binary.BigEndian.Uint64(to) != 0)) ||
				!e.only(unix.NFTA_DYNSET_SET_NAME, unix.NFTA_DYNSET_SET_ID, unix.NFTA_DYNSET_OP, unix.NFTA_DYNSET_SREG_KEY, unix.NFTA_DYNSET_FLAGS, unix.NFTA_DYNSET_TIMEOUT) {
				return "", rf, errors.New("dynset")
			}
			k, _, kerr := key(reg, s)
			if kerr != nil {
				return "", rf, kerr
			}
			out = append(out, "update @"+name+" { "+k+" }")
			rf.sets = append(rf.sets, name)
		default:
			err = errors.New("expression " + e.name)
		}
		if err != nil {
			return "", rf, err
		}
	}
	if len(regs) > 0 {
		return "", rf, errors.New("register loaded, never read")
	}
	if len(out) == 0 {
		return "", rf, errors.New("empty rule")
	}
	return strings.Join(out, " "), rf, nil
}

func (pr printer) payload(e nlExpr, load func(uint32, *field) error) error {
	reg, _ := e.u32(unix.NFTA_PAYLOAD_DREG)
	base, _ := e.u32(unix.NFTA_PAYLOAD_BASE)
	off, _ := e.u32(unix.NFTA_PAYLOAD_OFFSET)
	n, _ := e.u32(unix.NFTA_PAYLOAD_LEN)
	if !e.only(unix.NFTA_PAYLOAD_DREG, unix.NFTA_PAYLOAD_BASE, unix.NFTA_PAYLOAD_OFFSET, unix.NFTA_PAYLOAD_LEN) || n == 0 {
		return errors.New("payload")
	}
	al := uint32(pr.addrLen())
	saddr, daddr := uint32(12), uint32(16)
	if pr.family == 6 {
		saddr, daddr = 8, 24
	}
	switch {
	case base == unix.NFT_PAYLOAD_NETWORK_HEADER && (off == saddr || off == daddr) && n <= al:
		which := "saddr"
		if off == daddr {
			which = "daddr"
		}
		bits := -1
		if n < al {
			bits = int(n) * 8 // nft loads only the bytes of a byte-aligned prefix
		}
		return load(reg, &field{kind: fAddr, text: pr.ip() + " " + which, size: int(n), bits: bits})
	case base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && (off == 0 || off == 2) && n == 2:
		which := "th dport"
		if off == 0 {
			which = "th sport"
		}
		return load(reg, &field{kind: fPort, text: which, size: 2, bits: -1})
	}
	return errors.New("payload field")
}

func (pr printer) bitwise(e nlExpr, take func(uint32) (*field, int, error)) error {
	sreg, _ := e.u32(unix.NFTA_BITWISE_SREG)
	dreg, _ := e.u32(unix.NFTA_BITWISE_DREG)
	n, _ := e.u32(unix.NFTA_BITWISE_LEN)
	op, _ := e.u32(nftaBitwiseOp)
	mask, _, err1 := dataValue(e.attrs.get(unix.NFTA_BITWISE_MASK))
	xor, _, err2 := dataValue(e.attrs.get(unix.NFTA_BITWISE_XOR))
	f, _, err := take(sreg)
	if err != nil || err1 != nil || err2 != nil || sreg != dreg || op != 0 || int(n) != f.size || len(mask) != f.size || len(xor) != f.size || f.op != "" ||
		!e.only(unix.NFTA_BITWISE_SREG, unix.NFTA_BITWISE_DREG, unix.NFTA_BITWISE_LEN, unix.NFTA_BITWISE_MASK, unix.NFTA_BITWISE_XOR, nftaBitwiseOp) {
		return errors.New("bitwise")
	}
	zero := !slices.ContainsFunc(xor, func(b byte) bool { return b != 0 })
	switch f.kind {
	case fMark:
		m, x := binary.NativeEndian.Uint32(mask), binary.NativeEndian.Uint32(xor)
		switch {
		case x != 0 && m == ^x:
			f.op, f.val, f.text = "|", x, fmt.Sprintf("meta mark | 0x%08x", x)
		case x == 0:
			f.op, f.val, f.text = "&", m, fmt.Sprintf("meta mark & 0x%08x", m)
		case m == 0xffffffff:
			f.op, f.val, f.text = "^", x, fmt.Sprintf("meta mark ^ 0x%08x", x)
		default:
			return errors.New("bitwise on mark")
		}
	case fCtState, fCtStatus:
		if !zero {
			return errors.New("bitwise on ct")
		}
		f.op, f.val = "&", binary.NativeEndian.Uint32(mask)
	case fAddr:
		bits, ok := prefixBits(mask)
		if !zero || !ok || f.bits >= 0 || f.size != pr.addrLen() {
			return errors.New("bitwise on address")
		}
		f.bits = bits
	default:
		return errors.New("bitwise")
	}
	return nil
}

// prefixBits returns n when mask is n one bits then zeros.
func prefixBits(mask []byte) (int, bool) {
	n, end := 0, false
	for _, b := range mask {
		for i := 7; i >= 0; i-- {
			one := b>>i&1 == 1
			if one && end {
				return 0, false
			}
			if one {
				n++
			} else {
				end = true
			}
		}
	}
	return n, true
}

var ctStateNames = map[uint32]string{1: "invalid", 2: "established", 4: "related", 8: "new", 64: "untracked"}

// cmp prints a comparison; absorb says it completes the l4proto match
// just before it ("dport 80" after "meta l4proto tcp").
func (pr printer) cmp(e nlExpr, take func(uint32) (*field, int, error), regs map[int]*field) (s string, absorb bool, err error) {
	reg, _ := e.u32(unix.NFTA_CMP_SREG)
	op, _ := e.u32(unix.NFTA_CMP_OP)
	data, _, derr := dataValue(e.attrs.get(unix.NFTA_CMP_DATA))
	f, off, err := take(reg)
	if err != nil || derr != nil || (op != unix.NFT_CMP_EQ && op != unix.NFT_CMP_NEQ) || len(data) != f.size ||
		!e.only(unix.NFTA_CMP_SREG, unix.NFTA_CMP_OP, unix.NFTA_CMP_DATA) {
		return "", false, errors.New("cmp")
	}
	delete(regs, off)
	neq := op == unix.NFT_CMP_NEQ
	not := ""
	if neq {
		not = "!= "
	}
	switch f.kind {
	case fAddr:
		full := make([]byte, pr.addrLen())
		copy(full, data)
		a, _ := netipAddr(full)
		if f.bits < 0 {
			return f.text + " " + not + a.String(), false, nil
		}
		p := netipPrefix(a, f.bits)
		if p.Addr() != a {
			return "", false, errors.New("prefix with host bits")
		}
		return f.text + " " + not + p.String(), false, nil
	case fProto:
		name, ok := protoNames[data[0]]
		if neq || f.hton || !ok {
			return "", false, errors.New("l4proto cmp")
		}
		return "meta l4proto " + name, false, nil
	case fPort:
		if neq || f.text != "th dport" {
			return "", false, errors.New("port cmp")
		}
		return fmt.Sprintf("dport %d", binary.BigEndian.Uint16(data)), true, nil
	case fMark:
		if neq || f.op != "&" {
			return "", false, errors.New("mark cmp")
		}
		return fmt.Sprintf("meta mark & 0x%08x == 0x%08x", f.val, binary.NativeEndian.Uint32(data)), false, nil
	case fFib:
		if neq || binary.NativeEndian.Uint32(data) != unix.RTN_LOCAL {
			return "", false, errors.New("fib cmp")
		}
		return "fib saddr type local", false, nil
	case fCtState:
		name, ok := ctStateNames[f.val]
		if !neq || f.op != "&" || !ok || binary.NativeEndian.Uint32(data) != 0 {
			return "", false, errors.New("ct state cmp")
		}
		return "ct state " + name, false, nil
	case fCtStatus:
		if f.op != "&" || f.val != 0x20 || binary.NativeEndian.Uint32(data) != 0 { // IPS_DST_NAT
			return "", false, errors.New("ct status cmp")
		}
		if neq { // the hairpin rule: "ct status dnat" (the bit set)
			return "ct status dnat", false, nil
		}
		return "ct status ! dnat", false, nil
	}
	return "", false, errors.New("cmp operand")
}

func netipAddr(b []byte) (netip.Addr, bool) { return netip.AddrFromSlice(b) }

func netipPrefix(a netip.Addr, bits int) netip.Prefix {
	p, _ := a.Prefix(bits)
	return p
}

// nat prints a DNAT: to an address and port from immediates
// ("dnat to 198.19.1.2:8080"), or to what a data map returned
// ("dnat ip to numgen random mod 100 . meta l4proto map @wc-HASH").
func (pr printer) nat(e nlExpr, take func(uint32) (*field, int, error), regs map[int]*field) (string, error) {
	typ, _ := e.u32(unix.NFTA_NAT_TYPE)
	fam, _ := e.u32(unix.NFTA_NAT_FAMILY)
	amin, _ := e.u32(unix.NFTA_NAT_REG_ADDR_MIN)
	amax, _ := e.u32(unix.NFTA_NAT_REG_ADDR_MAX)
	pmin, _ := e.u32(unix.NFTA_NAT_REG_PROTO_MIN)
	pmax, _ := e.u32(unix.NFTA_NAT_REG_PROTO_MAX)
	fl, _ := e.u32(unix.NFTA_NAT_FLAGS)
	nfp := uint32(unix.NFPROTO_IPV4)
	if pr.family == 6 {
		nfp = unix.NFPROTO_IPV6
	}
	// The kernel adds NF_NAT_RANGE_MAP_IPS to what it was sent when an
	// address register is given; either way it maps the address.
	if typ != unix.NFT_NAT_DNAT || fam != nfp || amin != amax || pmin != pmax || fl|natRangeMapIPs != natRangeMapIPs|natRangeProtoSpec ||
		!e.only(unix.NFTA_NAT_TYPE, unix.NFTA_NAT_FAMILY, unix.NFTA_NAT_REG_ADDR_MIN, unix.NFTA_NAT_REG_ADDR_MAX, unix.NFTA_NAT_REG_PROTO_MIN, unix.NFTA_NAT_REG_PROTO_MAX, unix.NFTA_NAT_FLAGS) {
		return "", errors.New("nat")
	}
	a, aoff, err := take(amin)
	if err != nil {
		return "", err
	}
	poff, ok := regOff(pmin)
	if !ok {
		return "", errors.New("nat register")
	}
	al := pr.addrLen()
	switch a.kind {
	case fImm:
		p := regs[poff]
		if p == nil || p.kind != fImm || len(p.data) != 2 || len(a.data) != al || poff == aoff {
			return "", errors.New("dnat target")
		}
		delete(regs, aoff)
		delete(regs, poff)
		ip, _ := netipAddr(a.data)
		return "dnat to " + netip.AddrPortFrom(ip, binary.BigEndian.Uint16(p.data)).String(), nil
	case fMapData:
		want := typeIPAddr<<6 | typeInetServ
		if pr.family == 6 {
			want = typeIP6Addr<<6 | typeInetServ
		}
		if a.set.dataType != uint32(want) || int(a.set.dataLen) != pad4n(al)+4 || poff != aoff+pad4n(al) {
			return "", errors.New("dnat map data")
		}
		delete(regs, aoff)
		return "dnat " + pr.ip() + " to " + a.text, nil
	}
	return "", errors.New("dnat operand")
}

// anonymous prints the elements of an anonymous set a rule looks up.
func (pr printer) anonymous(s *nlSet, key []*field) (string, error) {
	es, err := pr.elements(s.name)
	if err != nil {
		return "", err
	}
	if len(key) == 1 && key[0].kind == fCtState {
		// ct state values, as names, in ascending order.
		var vals []uint32
		for _, e := range es {
			if len(e.key) != 4 || e.flags != 0 {
				return "", errors.New("ct state set")
			}
			vals = append(vals, binary.NativeEndian.Uint32(e.key))
		}
		slices.Sort(vals)
		names := make([]string, len(vals))
		for i, v := range vals {
			n, ok := ctStateNames[v]
			if !ok {
				return "", errors.New("ct state value")
			}
			names[i] = n
		}
		return strings.Join(names, ", "), nil
	}
	if len(key) != 1 || key[0].kind != fAddr || s.isMap() {
		return "", errors.New("anonymous set")
	}
	out := pr.elements0(s, es)
	texts := make([]string, len(out))
	for i, e := range out {
		if len(e.key) != 1 || strings.HasPrefix(e.key[0], "unknown") {
			return "", errors.New("anonymous set element")
		}
		texts[i] = e.key[0]
	}
	return strings.Join(texts, ", "), nil
}

// fieldTypes splits a set's key or data type into its fields and sizes.
func fieldTypes(magic, length uint32, numgen bool) ([]uint32, []int, bool) {
	var ts []uint32
	for m := magic; m != 0; m >>= 6 {
		ts = append([]uint32{m & 0x3f}, ts...)
	}
	sizes := make([]int, len(ts))
	integer, known := -1, 0
	for i, t := range ts {
		switch t {
		case typeIPAddr, typeMark:
			sizes[i] = 4
		case typeIP6Addr:
			sizes[i] = 16
		case typeInetProt:
			sizes[i] = 1
		case typeInetServ:
			sizes[i] = 2
		case typeInteger:
			if integer >= 0 || !numgen {
				return nil, nil, false
			}
			integer = i
			continue
		default:
			return nil, nil, false
		}
		known += sizes[i]
		if len(ts) > 1 {
			known += pad4n(sizes[i]) - sizes[i]
		}
	}
	if integer >= 0 {
		sizes[integer] = int(length) - known
		if sizes[integer] != 4 {
			return nil, nil, false
		}
	}
	total := 0
	for _, n := range sizes {
		if len(ts) > 1 {
			n = pad4n(n)
		}
		total += n
	}
	return ts, sizes, len(ts) > 0 && total == int(length)
}

// value prints one field.
func fieldText(t uint32, b []byte) string {
	switch t {
	case typeIPAddr, typeIP6Addr:
		a, _ := netipAddr(b)
		return a.String()
	case typeInetProt:
		if n, ok := protoNames[b[0]]; ok {
			return n
		}
		return fmt.Sprint(b[0])
	case typeInetServ:
		return fmt.Sprint(binary.BigEndian.Uint16(b))
	case typeInteger:
		return fmt.Sprint(binary.BigEndian.Uint32(b)) // numgen, turned to network order
	case typeMark:
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
	}
	return "unknown"
}

// fields prints a key or data value as its fields.
func fields(ts []uint32, sizes []int, b []byte) ([]string, bool) {
	var out []string
	off := 0
	for i, t := range ts {
		if off+sizes[i] > len(b) {
			return nil, false
		}
		out = append(out, fieldText(t, b[off:off+sizes[i]]))
		off += sizes[i]
		if len(ts) > 1 {
			off += pad4n(sizes[i]) - sizes[i]
		}
	}
	return out, off == len(b)
}

// elements0 prints a set's elements as nft lists them: key fields, the
// value, the comment; intervals as "lo-hi" (and as a prefix where the
// key is an address and the interval is one).
func (pr printer) elements0(s *nlSet, es []nlElem) []snapElem {
	bad := []snapElem{{key: []string{"unknown element"}}}
	kts, ksz, ok := fieldTypes(s.keyType, s.keyLen, s.numgenTypeof())
	if !ok {
		return bad
	}
	value := func(e nlElem) (string, bool) {
		switch {
		case !s.isMap():
			return "", true
		case s.verdictMap():
			v, err := verdictText(e.verdict)
			return v, err == nil
		}
		dts, dsz, ok := fieldTypes(s.dataType, s.dataLen, false)
		if !ok {
			return "", false
		}
		f, ok := fields(dts, dsz, e.data)
		return strings.Join(f, " . "), ok
	}
	// nft lists elements in the order of their keys.
	es = slices.Clone(es)
	slices.SortStableFunc(es, func(a, b nlElem) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return int(b.flags&unix.NFT_SET_ELEM_INTERVAL_END) - int(a.flags&unix.NFT_SET_ELEM_INTERVAL_END)
	})
	var out []snapElem
	switch {
	case s.interval() && len(kts) == 1:
		// One field (rbtree): start elements, each ended by the next
		// interval-end element (exclusive); the kernel keeps an end
		// element at zero.
		if s.isMap() {
			return bad
		}
		sorted := es
		for i, e := range sorted {
			if e.flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
				continue
			}
			if len(e.key) != ksz[0] {
				return bad
			}
			hi := bytes.Repeat([]byte{0xff}, len(e.key))
			if i+1 < len(sorted) {
				if sorted[i+1].flags&unix.NFT_SET_ELEM_INTERVAL_END == 0 {
					return bad
				}
				hi = minusOne(sorted[i+1].key)
			}
			out = append(out, snapElem{key: []string{intervalText(kts[0], e.key, hi)}, comment: e.comment})
		}
	case s.interval():
		// Concatenation (pipapo): each element has its own end.
		for _, e := range es {
			lo, ok1 := fields(kts, ksz, e.key)
			hi, ok2 := fields(kts, ksz, e.keyEnd)
			v, ok3 := value(e)
			if !ok1 || !ok2 || !ok3 {
				return bad
			}
			for i := range lo {
				if lo[i] != hi[i] {
					if kts[i] != typeInteger && kts[i] != typeInetServ {
						return bad
					}
					lo[i] += "-" + hi[i]
				}
			}
			out = append(out, snapElem{key: lo, value: v, comment: e.comment})
		}
	default:
		for _, e := range es {
			k, ok1 := fields(kts, ksz, e.key)
			v, ok2 := value(e)
			if !ok1 || !ok2 {
				return bad
			}
			out = append(out, snapElem{key: k, value: v, comment: e.comment})
		}
	}
	return out
}

func minusOne(b []byte) []byte {
	out := slices.Clone(b)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]--
		if out[i] != 0xff {
			break
		}
	}
	return out
}

// intervalText prints [lo, hi]: one value, a prefix, or "lo-hi".
func intervalText(t uint32, lo, hi []byte) string {
	if bytes.Equal(lo, hi) {
		return fieldText(t, lo)
	}
	if t == typeIPAddr || t == typeIP6Addr {
		a, _ := netipAddr(lo)
		for bits := 0; bits <= a.BitLen(); bits++ {
			p := netipPrefix(a, bits)
			if p.Addr() == a && bytes.Equal(lastAddr(p), hi) {
				return p.String()
			}
		}
	}
	return fieldText(t, lo) + "-" + fieldText(t, hi)
}

func lastAddr(p netip.Prefix) []byte {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	return b
}
