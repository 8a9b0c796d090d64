package nftables

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func payload(base expr.PayloadBase, off, n, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: base, Offset: off, Len: n}
}

// TestDecodeNftWritten: the statements only nft writes (the fixed chains,
// source ranges), given as the expressions nft 1.0.6 writes for them
// ("nft --debug=netlink"; TestNetlinkExplainMatchesNft reads them from the
// kernel), decode into the model's statements; what is no statement of
// the model decodes as opaque, never as a match it is not.
func TestDecodeNftWritten(t *testing.T) {
	nh, th := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader
	eq := func(reg uint32, b []byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: b} }
	anon := func(n string) ([]netip.Prefix, bool) {
		if n != "__set0" {
			return nil, false
		}
		return []netip.Prefix{netip.MustParsePrefix("198.19.128.0/24"), netip.MustParsePrefix("198.19.140.1/32")}, true
	}
	for _, c := range []struct {
		name string
		es   []expr.Any
		want rule
	}{
		{"fib", []expr.Any{&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true}, eq(1, ne32(unix.RTN_LOCAL)), &expr.Verdict{Kind: expr.VerdictJump, Chain: chainMarkMasq}},
			r(fibLocal, jump(chainMarkMasq))},
		{"masquerade", []expr.Any{&expr.Masq{FullyRandom: true}}, r(masquerade{})},
		{"mark or", []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(^uint32(0x4000)), Xor: ne32(0x4000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}, r(markSet{mark: 0x4000})},
		{"mark xor", []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0xffffffff), Xor: ne32(0x4000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}, r(markSet{xor: true, mark: 0x4000})},
		{"hairpin", []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0x20), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)},
			payload(nh, 16, 4, 9), &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 10}, payload(th, 2, 2, 11), payload(nh, 12, 4, 12),
			&expr.Lookup{SourceRegister: 9, SetName: setHairpin}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chainMarkMasq}},
			r(hairpinMatch{}, jump(chainMarkMasq))},
		{"one /24 source range", []expr.Any{payload(nh, 12, 3, 1), eq(1, []byte{198, 19, 128}), &expr.Verdict{Kind: expr.VerdictGoto, Chain: "ext-a"}},
			r(srcRanges{netip.MustParsePrefix("198.19.128.0/24")}, goTo("ext-a"))},
		{"one /23 source range", []expr.Any{payload(nh, 12, 3, 1),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 3, Mask: []byte{0xff, 0xff, 0xfe}, Xor: []byte{0, 0, 0}},
			eq(1, []byte{198, 19, 130}), &expr.Verdict{Kind: expr.VerdictGoto, Chain: "ext-a"}},
			r(srcRanges{netip.MustParsePrefix("198.19.130.0/23")}, goTo("ext-a"))},
		{"source ranges in an anonymous set", []expr.Any{payload(nh, 12, 4, 1), &expr.Lookup{SourceRegister: 1, SetName: "__set0"}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: "ext-a"}},
			r(srcRanges{netip.MustParsePrefix("198.19.128.0/24"), netip.MustParsePrefix("198.19.140.1/32")}, goTo("ext-a"))},
		{"a /24 of the destination is no source range", []expr.Any{payload(nh, 16, 3, 1), eq(1, []byte{198, 19, 128}), &expr.Verdict{Kind: expr.VerdictGoto, Chain: "ext-a"}},
			r(opaque("payload cmp"), goTo("ext-a"))},
		{"ct state new", []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(8), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chainFilterEndpoints}},
			r(opaque("ct bitwise cmp"), jump(chainFilterEndpoints))},
		{"DNAT from another register", []expr.Any{&expr.Immediate{Register: 2, Data: []byte{198, 19, 1, 2}}, &expr.Immediate{Register: 1, Data: []byte{0x1f, 0x90}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}},
			r(opaque("immediate immediate nat"))},
	} {
		f := famOf(4)
		got := decodeRule(f, listed(t, f, c.es...), anon)
		if !rulesEqual([]rule{got}, []rule{c.want}) {
			t.Errorf("%s: decodes as\n  %s\nwant\n  %s", c.name, got.text(f), c.want.text(f))
		}
	}
}

// TestRangePrefixes: an interval set's range back to the prefixes it was
// written from.
func TestRangePrefixes(t *testing.T) {
	a := netip.MustParseAddr
	for _, c := range []struct {
		lo, hi netip.Addr
		want   []string
	}{
		{a("198.19.128.0"), a("198.19.128.255"), []string{"198.19.128.0/24"}},
		{a("198.19.130.0"), a("198.19.131.255"), []string{"198.19.130.0/23"}},
		{a("198.19.140.1"), a("198.19.140.1"), []string{"198.19.140.1/32"}},
		{a("198.19.0.1"), a("198.19.0.6"), []string{"198.19.0.1/32", "198.19.0.2/31", "198.19.0.4/31", "198.19.0.6/32"}},
		{a("2001:2:0:9000::"), a("2001:2:0:9fff:ffff:ffff:ffff:ffff"), []string{"2001:2:0:9000::/52"}},
	} {
		var got []string
		for _, p := range rangePrefixes(c.lo, c.hi) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s-%s: %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	if bits, ok := prefixLen([]byte{0xff, 0xf0, 0}); !ok || bits != 12 {
		t.Errorf("prefixLen ff f0 00: %d %v", bits, ok)
	}
	if _, ok := prefixLen([]byte{0xff, 0x0f}); ok {
		t.Error("prefixLen ff 0f: a mask")
	}
}

// TestNumgenOffset: a split drawing from its range of a shared weight map
// spells itself as nft 1.0.6 lists it (seen in a namespace) and decodes
// from its own expressions with its offset; without an offset the text
// has none, as nft prints it.
func TestNumgenOffset(t *testing.T) {
	f := famOf(4)
	for _, c := range []struct {
		s    stmt
		text string
	}{
		{numgenDNAT{1000000, 1000000, "d5"}, "dnat ip to numgen random mod 1000000 offset 1000000 map @d5"},
		{numgenDNAT{1000000, 0, "d5"}, "dnat ip to numgen random mod 1000000 map @d5"},
		{numgenVmap{1000000, 4293000000, "w5"}, "numgen random mod 1000000 offset 4293000000 vmap @w5"},
	} {
		want := r(l4proto(unix.IPPROTO_TCP), c.s)
		if got := want.text(f); got != "meta l4proto tcp "+c.text {
			t.Errorf("text %q, want %q", got, "meta l4proto tcp "+c.text)
		}
		es, err := want.encode(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := decodeRule(f, listed(t, f, es...), nil); !rulesEqual([]rule{got}, []rule{want}) {
			t.Errorf("%s: decodes as %s", c.text, got.text(f))
		}
	}
}
