package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Reading the model back from the kernel. A rule's expressions are
// decoded by google/nftables' expression types (expr.Unmarshal), then
// recognised statement by statement: each statement steelyard writes is
// the sequence its encode writes (or nft writes for its text, for the
// fixed chains), with the same registers, so decodeRule(encode(r)) is r
// (TestDecodeRendered). A sequence that is no statement of the model
// becomes one opaque statement, which Explain never takes for a match,
// jump or split.
//
// google/nftables v0.3.0 decodes every expression steelyard writes but
// byteorder (its unmarshal says "not yet implemented", and GetRules then
// fails for the whole chain). So rules come from one dump of the table
// (rules_dump.go) and each expression is decoded here: byteorder by
// decodeByteorder, the others by the library.

// kexpr is one expression of a rule as the kernel lists it; e is nil for
// an expression type this package does not decode.
type kexpr struct {
	name string
	e    expr.Any
}

// newExpr returns an empty expression of a type steelyard's tables hold.
func newExpr(name string) expr.Any {
	switch name {
	case "payload":
		return &expr.Payload{}
	case "cmp":
		return &expr.Cmp{}
	case "meta":
		return &expr.Meta{}
	case "lookup":
		return &expr.Lookup{}
	case "immediate":
		return &expr.Immediate{}
	case "nat":
		return &expr.NAT{}
	case "numgen":
		return &expr.Numgen{}
	case "dynset":
		return &expr.Dynset{}
	case "fib":
		return &expr.Fib{}
	case "ct":
		return &expr.Ct{}
	case "bitwise":
		return &expr.Bitwise{}
	case "counter":
		return &expr.Counter{}
	case "masq":
		return &expr.Masq{}
	case "reject":
		return &expr.Reject{}
	}
	return nil
}

// decodeExprs reads NFTA_RULE_EXPRESSIONS for family fam (NFPROTO_*).
func decodeExprs(fam byte, b []byte) ([]kexpr, error) {
	var out []kexpr
	err := eachAttr(b, func(typ uint16, it []byte) error {
		if typ != unix.NFTA_LIST_ELEM {
			return nil
		}
		name := string(bytes.TrimRight(attrGet(it, unix.NFTA_EXPR_NAME), "\x00"))
		data := attrGet(it, unix.NFTA_EXPR_DATA)
		k := kexpr{name: name}
		if name == "byteorder" {
			bo, err := decodeByteorder(data)
			if err != nil {
				return err
			}
			k.e = bo
		} else if e := newExpr(name); e != nil {
			if err := expr.Unmarshal(fam, data, e); err != nil {
				return err
			}
			// A verdict is an immediate into the verdict register.
			if imm, ok := e.(*expr.Immediate); ok && imm.Register == unix.NFT_REG_VERDICT && len(imm.Data) == 0 {
				e = &expr.Verdict{}
				if err := expr.Unmarshal(fam, data, e); err != nil {
					return err
				}
			}
			k.e = e
		}
		out = append(out, k)
		return nil
	})
	return out, err
}

// decodeByteorder is the adapter for the one expression google/nftables
// v0.3.0 cannot decode: five big-endian u32 attributes.
func decodeByteorder(b []byte) (*expr.Byteorder, error) {
	bo := &expr.Byteorder{}
	err := eachAttr(b, func(typ uint16, v []byte) error {
		if len(v) != 4 {
			return errors.New("nftables: byteorder attribute length")
		}
		x := binary.BigEndian.Uint32(v)
		switch typ {
		case unix.NFTA_BYTEORDER_SREG:
			bo.SourceRegister = x
		case unix.NFTA_BYTEORDER_DREG:
			bo.DestRegister = x
		case unix.NFTA_BYTEORDER_OP:
			bo.Op = expr.ByteorderOp(x)
		case unix.NFTA_BYTEORDER_LEN:
			bo.Len = x
		case unix.NFTA_BYTEORDER_SIZE:
			bo.Size = x
		}
		return nil
	})
	return bo, err
}

// ruleReader walks a rule's expressions.
type ruleReader struct {
	f  fam
	es []kexpr
	i  int
	// ranges returns the prefixes of an anonymous set (false: the set is
	// not anonymous).
	ranges func(set string) ([]netip.Prefix, bool)
}

func at[T expr.Any](d *ruleReader, k int) (T, bool) {
	var zero T
	if d.i+k >= len(d.es) {
		return zero, false
	}
	x, ok := d.es[d.i+k].e.(T)
	return x, ok
}

// decodeRule reads a rule's expressions as the model's statements.
func decodeRule(f fam, es []kexpr, ranges func(string) ([]netip.Prefix, bool)) rule {
	d := &ruleReader{f: f, es: es, ranges: ranges}
	var out rule
	for d.i < len(d.es) {
		s, n := d.next()
		if n == 0 {
			// No statement: one opaque statement for the whole run.
			name := d.es[d.i].name
			if k := len(out) - 1; k >= 0 {
				if o, ok := out[k].(opaque); ok {
					out[k] = o + opaque(" "+name)
					d.i++
					continue
				}
			}
			out = append(out, opaque(name))
			d.i++
			continue
		}
		out = append(out, s)
		d.i += n
	}
	return out
}

// next recognises the statement at d.i and how many expressions it takes
// (0: none).
func (d *ruleReader) next() (stmt, int) {
	var s stmt
	n := 0
	switch d.es[d.i].e.(type) {
	case *expr.Payload:
		s, n = d.addrStmt()
	case *expr.Meta:
		if s, n = d.protoStmt(); n == 0 {
			s, n = d.markStmt()
		}
	case *expr.Numgen:
		s, n = d.numgenStmt()
	case *expr.Immediate:
		s, n = d.dnatStmt()
	case *expr.Fib:
		s, n = d.fibStmt()
	case *expr.Ct:
		s, n = d.hairpinStmt()
	}
	if n > 0 {
		return s, n
	}
	switch x := d.es[d.i].e.(type) {
	case *expr.Verdict:
		return verdict{x.Kind, x.Chain}, 1
	case *expr.Masq:
		if x.FullyRandom && !x.Random && !x.Persistent && !x.ToPorts {
			return masquerade{}, 1
		}
	}
	return nil, 0
}

// addrField reports which address a payload expression loads into
// register 1, and how many of its bytes (nft loads only the bytes a
// prefix covers); ok false: none.
func (d *ruleReader) addrField(p *expr.Payload) (addrField, int, bool) {
	for _, fd := range []addrField{saddr, daddr} {
		w := fd.load(d.f)
		if p.OperationType == expr.PayloadLoad && p.Base == w.Base && p.Offset == w.Offset && p.Len > 0 && p.Len <= w.Len && p.DestRegister == 1 {
			return fd, int(p.Len), true
		}
	}
	return false, 0, false
}

// addrStmt: addrIs, inSet, srcRanges (an anonymous set, or one prefix
// that nft matches on the bytes it covers, with a mask when it ends
// inside a byte) and updateSaddr.
func (d *ruleReader) addrStmt() (stmt, int) {
	p, ok := at[*expr.Payload](d, 0)
	if !ok {
		return nil, 0
	}
	fd, n, ok := d.addrField(p)
	if !ok {
		return nil, 0
	}
	alen := int(fd.load(d.f).Len)
	// prefix reads the compared bytes (masked to bits) as a prefix.
	prefix := func(c *expr.Cmp, bits int) (stmt, bool) {
		if c.Op != expr.CmpOpEq || c.Register != 1 || len(c.Data) != n || fd != saddr {
			return nil, false
		}
		a, ok := netip.AddrFromSlice(append(slices.Clone(c.Data), make([]byte, alen-n)...))
		return srcRanges{netip.PrefixFrom(a, bits)}, ok
	}
	if c, ok := at[*expr.Cmp](d, 1); ok {
		if n == alen && c.Op == expr.CmpOpEq && c.Register == 1 && len(c.Data) == n {
			a, _ := netip.AddrFromSlice(c.Data)
			return addrIs{fd, a}, 2
		}
		if s, ok := prefix(c, 8*n); ok && n < alen {
			return s, 2
		}
		return nil, 0
	}
	if b, ok := at[*expr.Bitwise](d, 1); ok && b.SourceRegister == 1 && b.DestRegister == 1 && int(b.Len) == n && allZero(b.Xor) {
		c, okc := at[*expr.Cmp](d, 2)
		if bits, okb := prefixLen(b.Mask); okc && okb {
			if s, ok := prefix(c, bits); ok {
				return s, 3
			}
		}
		return nil, 0
	}
	if n != alen {
		return nil, 0
	}
	if l, ok := at[*expr.Lookup](d, 1); ok && l.SourceRegister == 1 && !l.IsDestRegSet {
		if ps, anon := d.ranges(l.SetName); anon {
			if fd != saddr || l.Invert {
				return nil, 0
			}
			return srcRanges(ps), 2
		}
		return inSet{fd, l.Invert, l.SetName}, 2
	}
	if ds, ok := at[*expr.Dynset](d, 1); ok && fd == saddr && ds.Operation == unix.NFT_DYNSET_OP_UPDATE && ds.SrcRegKey == 1 && ds.SrcRegData == 0 && len(ds.Exprs) == 0 {
		return updateSaddr(ds.SetName), 2
	}
	return nil, 0
}

// protoStmt: "meta l4proto X", or with the port after it "X dport N".
func (d *ruleReader) protoStmt() (stmt, int) {
	m, ok := at[*expr.Meta](d, 0)
	c, okc := at[*expr.Cmp](d, 1)
	if !ok || !okc || m.Key != expr.MetaKeyL4PROTO || m.SourceRegister || m.Register != 1 || c.Op != expr.CmpOpEq || c.Register != 1 || len(c.Data) != 1 {
		return nil, 0
	}
	p, okp := at[*expr.Payload](d, 2)
	pc, okpc := at[*expr.Cmp](d, 3)
	if okp && okpc && p.OperationType == expr.PayloadLoad && p.Base == expr.PayloadBaseTransportHeader && p.Offset == 2 && p.Len == 2 && p.DestRegister == 1 &&
		pc.Op == expr.CmpOpEq && pc.Register == 1 && len(pc.Data) == 2 {
		return dport{c.Data[0], binary.BigEndian.Uint16(pc.Data)}, 4
	}
	return l4proto(c.Data[0]), 2
}

// numgenStmt: the draw of a split, numgenKey then a verdict map lookup
// (numgenVmap) or a data map lookup and DNAT (numgenDNAT).
func (d *ruleReader) numgenStmt() (stmt, int) {
	ng, ok := at[*expr.Numgen](d, 0)
	if !ok || ng.Register != 1 || ng.Type != unix.NFT_NG_RANDOM {
		return nil, 0
	}
	want := numgenKey(ng.Modulus, ng.Offset, nil)
	for k := 1; k < len(want); k++ {
		if k >= len(d.es)-d.i || !sameExpr(d.es[d.i+k].e, want[k]) {
			return nil, 0
		}
	}
	n := len(want)
	l, ok := at[*expr.Lookup](d, n)
	if !ok || l.SourceRegister != 1 || !l.IsDestRegSet || l.Invert {
		return nil, 0
	}
	if l.DestRegister == 0 {
		return numgenVmap{ng.Modulus, ng.Offset, l.SetName}, n + 1
	}
	s := numgenDNAT{ng.Modulus, ng.Offset, l.SetName}
	es, _ := s.encode(d.f, nil)
	if nat, ok := at[*expr.NAT](d, n+1); ok && l.DestRegister == 1 && sameExpr(nat, es[len(es)-1]) {
		return s, n + 2
	}
	return nil, 0
}

// dnatStmt: "dnat to address:port".
func (d *ruleReader) dnatStmt() (stmt, int) {
	a, ok1 := at[*expr.Immediate](d, 0)
	p, ok2 := at[*expr.Immediate](d, 1)
	nat, ok3 := at[*expr.NAT](d, 2)
	if !ok1 || !ok2 || !ok3 || a.Register != 1 || p.Register != 2 || len(p.Data) != 2 {
		return nil, 0
	}
	addr, ok := netip.AddrFromSlice(a.Data)
	if !ok {
		return nil, 0
	}
	s := dnatTo(netip.AddrPortFrom(addr, binary.BigEndian.Uint16(p.Data)))
	es, err := s.encode(d.f, nil)
	if err != nil || !sameExpr(nat, es[2]) {
		return nil, 0
	}
	return s, 3
}

// markStmt: "meta mark set meta mark | M" (and "^ M"): load the mark,
// keep the other bits and set (or flip) M, store it.
func (d *ruleReader) markStmt() (stmt, int) {
	ld, ok1 := at[*expr.Meta](d, 0)
	b, ok2 := at[*expr.Bitwise](d, 1)
	st, ok3 := at[*expr.Meta](d, 2)
	if !ok1 || !ok2 || !ok3 || ld.Key != expr.MetaKeyMARK || ld.SourceRegister || st.Key != expr.MetaKeyMARK || !st.SourceRegister ||
		b.SourceRegister != ld.Register || b.DestRegister != st.Register || len(b.Mask) != 4 || len(b.Xor) != 4 {
		return nil, 0
	}
	mask, x := binary.NativeEndian.Uint32(b.Mask), binary.NativeEndian.Uint32(b.Xor)
	switch {
	case mask == ^x:
		return markSet{mark: x}, 3
	case mask == 0xffffffff:
		return markSet{xor: true, mark: x}, 3
	}
	return nil, 0
}

// fibStmt: "fib saddr type local".
func (d *ruleReader) fibStmt() (stmt, int) {
	fb, ok := at[*expr.Fib](d, 0)
	c, okc := at[*expr.Cmp](d, 1)
	if !ok || !okc || !fb.FlagSADDR || !fb.ResultADDRTYPE || fb.FlagDADDR || fb.FlagMARK || fb.FlagIIF || fb.FlagOIF ||
		c.Op != expr.CmpOpEq || c.Register != fb.Register || len(c.Data) != 4 || binary.NativeEndian.Uint32(c.Data) != unix.RTN_LOCAL {
		return nil, 0
	}
	return fibLocal, 2
}

// hairpinStmt: "ct status dnat" (ct, bitwise, cmp) then the four fields
// of the hairpin set's key and its lookup.
func (d *ruleReader) hairpinStmt() (stmt, int) {
	ct, ok := at[*expr.Ct](d, 0)
	if !ok || ct.Key != expr.CtKeySTATUS || ct.SourceRegister {
		return nil, 0
	}
	_, ok1 := at[*expr.Bitwise](d, 1)
	c, ok2 := at[*expr.Cmp](d, 2)
	_, ok3 := at[*expr.Payload](d, 3)
	_, ok4 := at[*expr.Meta](d, 4)
	_, ok5 := at[*expr.Payload](d, 5)
	_, ok6 := at[*expr.Payload](d, 6)
	l, ok7 := at[*expr.Lookup](d, 7)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || c.Op != expr.CmpOpNeq || l.SetName != setHairpin || l.IsDestRegSet || l.Invert {
		return nil, 0
	}
	return hairpinMatch{}, 8
}

// sameExpr compares two expressions by value.
func sameExpr(a, b expr.Any) bool {
	switch x := a.(type) {
	case *expr.Byteorder:
		y, ok := b.(*expr.Byteorder)
		return ok && *x == *y
	case *expr.Meta:
		y, ok := b.(*expr.Meta)
		return ok && *x == *y
	case *expr.NAT:
		y, ok := b.(*expr.NAT)
		return ok && *x == *y
	}
	return false
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// prefixLen is the length of a netmask (false: not one).
func prefixLen(mask []byte) (int, bool) {
	bits := 0
	for i, x := range mask {
		if x == 0xff {
			bits += 8
			continue
		}
		for x&0x80 != 0 {
			bits++
			x <<= 1
		}
		if x != 0 || !allZero(mask[i+1:]) {
			return 0, false
		}
		break
	}
	return bits, true
}

// rangePrefixes covers the addresses lo up to hi (both included) with
// prefixes, largest first: how an interval set holds a source range list.
func rangePrefixes(lo, hi netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for lo.IsValid() && lo.Compare(hi) <= 0 {
		bits := lo.BitLen()
		// The shortest prefix that starts at lo and ends at or before hi.
		for bits > 0 {
			p := netip.PrefixFrom(lo, bits-1).Masked()
			if p.Addr() != lo || lastOf(p).Compare(hi) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(lo, bits)
		out = append(out, p)
		lo = lastOf(p).Next()
	}
	return out
}

// lastOf is the last address of a prefix.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// eachAttr calls fn for each netlink attribute in b (length and type in
// host order, the value padded to 4 bytes).
func eachAttr(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return errors.New("nftables: bad netlink attribute")
		}
		if err := fn(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:n:n]); err != nil {
			return err
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return nil
}

// attrGet returns the value of the first attribute of type t in b (nil:
// none, or malformed).
func attrGet(b []byte, t uint16) []byte {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil
		}
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == t {
			return b[4:n:n]
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return nil
}

// hasStmt reports whether rule r holds statement s.
func (r rule) hasStmt(s stmt) bool {
	for _, x := range r {
		if stmtEqual(x, s) {
			return true
		}
	}
	return false
}

// verdictOf is the rule's verdict (ok false: none).
func (r rule) verdictOf() (verdict, bool) {
	if len(r) == 0 {
		return verdict{}, false
	}
	v, ok := r[len(r)-1].(verdict)
	return v, ok
}
