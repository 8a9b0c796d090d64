package nftables

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The expected texts below are what nft 1.0.6 lists for the same rules
// (checked in a throwaway namespace: "nft list table" beside "nft
// --debug=netlink list table", whose bytecode the expressions here copy);
// the set descriptions are what the kernel (6.18) dumps for the sets nft
// created. The printer is checked against those, not against itself.

// numgenUD is the part of a "typeof numgen ..." set's user data that
// names numgen (see numgenTypeof).
var numgenUD = binary.NativeEndian.AppendUint32([]byte{0, 4}, 23)

func testSets(family int) map[string]*nlSet {
	if family == 6 {
		return map[string]*nlSet{
			"hairpin":       {name: "hairpin", keyType: typeIP6Addr<<6 | typeIP6Addr, keyLen: 32},
			"service-ips":   {name: "service-ips", flags: unix.NFT_SET_MAP, keyType: typeIP6Addr<<12 | typeInetProt<<6 | typeInetServ, keyLen: 24, dataType: verdictMagic, dataLen: 16},
			"wd-a":          {name: "wd-a", flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: typeIP6Addr<<6 | typeInetServ, dataLen: 20, userdata: numgenUD},
			"cluster-cidrs": {name: "cluster-cidrs", flags: unix.NFT_SET_INTERVAL, keyType: typeIP6Addr, keyLen: 16},
		}
	}
	return map[string]*nlSet{
		"hairpin":           {name: "hairpin", keyType: 0x1c7, keyLen: 8},
		"wc-a":              {name: "wc-a", flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: verdictMagic, dataLen: 16, userdata: numgenUD},
		"wd-a":              {name: "wd-a", flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: 0x1cd, dataLen: 8, userdata: numgenUD},
		"__set0":            {name: "__set0", flags: 0x3, keyType: 0x1a, keyLen: 4},
		"__set1":            {name: "__set1", flags: 0x7, keyType: typeIPAddr, keyLen: 4},
		"service-ips":       {name: "service-ips", flags: unix.NFT_SET_MAP, keyType: 0x730d, keyLen: 12, dataType: verdictMagic, dataLen: 16},
		"service-nodeports": {name: "service-nodeports", flags: unix.NFT_SET_MAP, keyType: 0x30d, keyLen: 8, dataType: verdictMagic, dataLen: 16},
		"cluster-cidrs":     {name: "cluster-cidrs", flags: unix.NFT_SET_INTERVAL, keyType: typeIPAddr, keyLen: 4},
		"nodeport-ips":      {name: "nodeport-ips", keyType: typeIPAddr, keyLen: 4},
		"ports":             {name: "ports", keyType: typeInetServ, keyLen: 2},
		"af-a":              {name: "af-a", flags: 0x30, keyType: typeIPAddr, keyLen: 4, timeoutMS: 600000, hasTimeout: true},
	}
}

// testElems are the anonymous sets' elements as the kernel dumped them.
var testElems = map[string][]nlElem{
	"__set0": {{key: ne32(4)}, {key: ne32(2)}},
	"__set1": {
		{key: ip4("198.19.200.10"), flags: 1}, {key: ip4("198.19.200.0")},
		{key: ip4("198.19.140.2"), flags: 1}, {key: ip4("198.19.140.1")},
		{key: ip4("198.19.132.0"), flags: 1}, {key: ip4("198.19.130.0")},
		{key: ip4("198.19.129.0"), flags: 1}, {key: ip4("198.19.128.0")},
		{key: ip4("0.0.0.0"), flags: 1},
	},
}

func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
func ip4(s string) []byte  { return netip.MustParseAddr(s).AsSlice() }
func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func testPrinter(family int) printer {
	sets := testSets(family)
	return printer{family: family, set: func(n string) *nlSet { return sets[n] },
		elements: func(n string) ([]nlElem, error) { return testElems[n], nil }}
}

// exprs encodes es as the kernel would dump them and decodes them again.
func exprs(t *testing.T, family int, es ...expr.Any) []nlExpr {
	t.Helper()
	fam := byte(unix.NFPROTO_IPV4)
	if family == 6 {
		fam = unix.NFPROTO_IPV6
	}
	var out []nlExpr
	for _, e := range es {
		b, err := expr.Marshal(fam, e)
		if err != nil {
			t.Fatal(err)
		}
		d, err := decodeExpr(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

func payload(base expr.PayloadBase, off, n, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: base, Offset: off, Len: n}
}

const nh, th = expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader

func cmpEq(reg uint32, data []byte) *expr.Cmp {
	return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data}
}

func TestPrintRules(t *testing.T) {
	jump := func(c string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: c} }
	gotoC := func(c string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: c} }
	markLoad := &expr.Meta{Key: expr.MetaKeyMARK, Register: 1}
	l4 := func(reg uint32) *expr.Meta { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }
	comment := userdata.AppendString(nil, userdata.TypeComment, "ns/a:http")
	cases := []struct {
		family int
		want   string
		es     []expr.Any
		udata  []byte
	}{
		{4, "meta mark set meta mark | 0x00002000", []expr.Any{markLoad,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0xffffdfff), Xor: ne32(0x2000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}, nil},
		{4, "ip saddr . ip daddr @hairpin jump mark-for-masquerade", []expr.Any{payload(nh, 12, 4, 1), payload(nh, 16, 4, 9),
			&expr.Lookup{SourceRegister: 1, SetName: "hairpin"}, jump("mark-for-masquerade")}, nil},
		{4, "meta mark & 0x00002000 == 0x00000000 return", []expr.Any{markLoad,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0x2000), Xor: ne32(0)},
			cmpEq(1, ne32(0)), &expr.Verdict{Kind: expr.VerdictReturn}}, nil},
		{4, "meta mark set meta mark ^ 0x00002000", []expr.Any{markLoad,
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0xffffffff), Xor: ne32(0x2000)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1}}, nil},
		{4, "masquerade fully-random", []expr.Any{&expr.Masq{FullyRandom: true}}, nil},
		{4, "reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 3}}, nil},
		{6, "reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}}, nil},
		{4, "reject with tcp reset", []expr.Any{l4(1), cmpEq(1, []byte{6}), &expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}, nil},
		{4, `update @af-a { ip saddr } comment "ns/a:http"`, []expr.Any{payload(nh, 12, 4, 1),
			&expr.Dynset{SrcRegKey: 1, SetName: "af-a", Operation: unix.NFT_DYNSET_OP_UPDATE}}, comment},
		{4, "ip saddr @af-a goto ep-a", []expr.Any{payload(nh, 12, 4, 1), &expr.Lookup{SourceRegister: 1, SetName: "af-a"}, gotoC("ep-a")}, nil},
		{4, "ip saddr @cluster-cidrs goto svc-a", []expr.Any{payload(nh, 12, 4, 1), &expr.Lookup{SourceRegister: 1, SetName: "cluster-cidrs"}, gotoC("svc-a")}, nil},
		{4, "fib saddr type local jump mark-for-masquerade", []expr.Any{&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
			cmpEq(1, ne32(unix.RTN_LOCAL)), jump("mark-for-masquerade")}, nil},
		{4, "ip saddr 198.19.128.0/24 goto ext-a", []expr.Any{payload(nh, 12, 3, 1), cmpEq(1, []byte{198, 19, 128}), gotoC("ext-a")}, nil},
		{4, "ip saddr 198.19.0.0/17 goto ext-a", []expr.Any{payload(nh, 12, 4, 1),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 128, 0}, Xor: make([]byte, 4)},
			cmpEq(1, ip4("198.19.0.0")), gotoC("ext-a")}, nil},
		{4, "ip saddr 0.0.0.0/0 goto ext-a", []expr.Any{payload(nh, 12, 4, 1),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: make([]byte, 4), Xor: make([]byte, 4)},
			cmpEq(1, make([]byte, 4)), gotoC("ext-a")}, nil},
		{4, "ip saddr { 198.19.128.0/24, 198.19.130.0/23, 198.19.140.1, 198.19.200.0-198.19.200.9 } goto ext-a", []expr.Any{payload(nh, 12, 4, 1),
			&expr.Lookup{SourceRegister: 1, SetName: "__set1"}, gotoC("ext-a")}, nil},
		{4, "meta l4proto tcp dnat ip to numgen random mod 1000000 . meta l4proto map @wd-a", []expr.Any{l4(1), cmpEq(1, []byte{6}),
			&expr.Numgen{Register: 1, Modulus: 1000000, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
			l4(9), &expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Size: 2, Len: 1},
			&expr.Lookup{SourceRegister: 1, SetName: "wd-a", DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 9, RegProtoMax: 9, Specified: true}}, nil},
		{6, "meta l4proto tcp dnat ip6 to numgen random mod 1000000 . meta l4proto map @wd-a", []expr.Any{l4(1), cmpEq(1, []byte{6}),
			&expr.Numgen{Register: 1, Modulus: 1000000, Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
			l4(9), &expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Size: 2, Len: 1},
			&expr.Lookup{SourceRegister: 1, SetName: "wd-a", DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}}, nil},
		{4, "counter packets 0 bytes 0", []expr.Any{&expr.Counter{}}, nil},
		{4, "ip daddr . meta l4proto . th dport vmap @service-ips", []expr.Any{payload(nh, 16, 4, 1), l4(9), payload(th, 2, 2, 10),
			&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true}}, nil},
		{6, "ip6 daddr . meta l4proto . th dport vmap @service-ips", []expr.Any{payload(nh, 24, 16, 1), l4(2), payload(th, 2, 2, 13),
			&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true}}, nil},
		{6, "ip6 saddr . ip6 daddr @hairpin jump mark-for-masquerade", []expr.Any{payload(nh, 8, 16, 1), payload(nh, 24, 16, 2),
			&expr.Lookup{SourceRegister: 1, SetName: "hairpin"}, jump("mark-for-masquerade")}, nil},
		{4, "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports", []expr.Any{payload(nh, 16, 4, 1),
			&expr.Lookup{SourceRegister: 1, SetName: "nodeport-ips"}, l4(1), payload(th, 2, 2, 9),
			&expr.Lookup{SourceRegister: 1, SetName: "service-nodeports", IsDestRegSet: true}}, nil},
		{4, "ip saddr 127.0.0.0/8 ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports", []expr.Any{
			payload(nh, 12, 1, 1), cmpEq(1, []byte{127}), payload(nh, 16, 1, 1), cmpEq(1, []byte{127}),
			l4(1), payload(th, 2, 2, 9), &expr.Lookup{SourceRegister: 1, SetName: "service-nodeports", IsDestRegSet: true}}, nil},
		{4, `ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status ! dnat drop comment "block incoming localnet connections"`, []expr.Any{
			payload(nh, 16, 1, 1), cmpEq(1, []byte{127}), payload(nh, 12, 1, 1), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{127}},
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE}, &expr.Lookup{SourceRegister: 1, SetName: "__set0", Invert: true},
			&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(0x20), Xor: ne32(0)},
			cmpEq(1, ne32(0)), &expr.Verdict{Kind: expr.VerdictDrop}}, userdata.AppendString(nil, userdata.TypeComment, "block incoming localnet connections")},
		{4, "ct state new jump filter-endpoints", []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(8), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)}, jump("filter-endpoints")}, nil},
		{6, "ip6 saddr 2001:2::/48 goto ep-a", []expr.Any{payload(nh, 8, 6, 1), cmpEq(1, netip.MustParseAddr("2001:2::").AsSlice()[:6]), gotoC("ep-a")}, nil},
		{6, "ip6 saddr 2001:2::/60 goto ep-a", []expr.Any{payload(nh, 8, 16, 1),
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 16, Mask: netip.MustParseAddr("ffff:ffff:ffff:fff0::").AsSlice(), Xor: make([]byte, 16)},
			cmpEq(1, netip.MustParseAddr("2001:2::").AsSlice()), gotoC("ep-a")}, nil},
	}
	for _, c := range cases {
		pr := testPrinter(c.family)
		got, _ := pr.rule(exprs(t, c.family, c.es...), c.udata)
		if got != c.want {
			t.Errorf("family %d:\n got %s\nwant %s", c.family, got, c.want)
		}
	}
}

// TestPrintWriterRules: every rule shape the netlink writer encodes (as nft
// does, TestNetlinkMatchesNft) prints back as the text the model spells
// for nft.
func TestPrintWriterRules(t *testing.T) {
	a4, a6 := netip.MustParseAddr, netip.MustParseAddrPort
	tcp, udp, sctp := protoNumbers["tcp"], protoNumbers["udp"], protoNumbers["sctp"]
	notCIDRs := inSet{saddr, true, setClusterCIDRs}
	for _, c := range []struct {
		family int
		r      rule
		want   string
	}{
		{4, r(addrIs{saddr, a4("198.19.1.2")}, jump("mark-for-masquerade")), "ip saddr 198.19.1.2 jump mark-for-masquerade"},
		{4, r(l4proto(tcp), dnatTo(a6("198.19.1.2:8080"))), "meta l4proto tcp dnat to 198.19.1.2:8080"},
		{4, r(l4proto(udp), dnatTo(a6("198.19.1.2:53"))), "meta l4proto udp dnat to 198.19.1.2:53"},
		{4, r(l4proto(sctp), dnatTo(a6("198.19.1.2:2905"))), "meta l4proto sctp dnat to 198.19.1.2:2905"},
		{6, r(l4proto(sctp), dnatTo(a6("[2001:2::1:2]:2905"))), "meta l4proto sctp dnat to [2001:2::1:2]:2905"},
		{6, r(l4proto(tcp), dnatTo(a6("[2001:2::1:2]:8080"))), "meta l4proto tcp dnat to [2001:2::1:2]:8080"},
		{4, r(addrIs{daddr, a4("198.18.0.10")}, dport{tcp, 80}, notCIDRs, jump("mark-for-masquerade")), "ip daddr 198.18.0.10 tcp dport 80 ip saddr != @cluster-cidrs jump mark-for-masquerade"},
		{4, r(addrIs{daddr, a4("198.18.0.10")}, dport{udp, 53}, jump("mark-for-masquerade")), "ip daddr 198.18.0.10 udp dport 53 jump mark-for-masquerade"},
		{4, r(addrIs{daddr, a4("198.18.0.40")}, dport{sctp, 2905}, notCIDRs, jump("mark-for-masquerade")), "ip daddr 198.18.0.40 sctp dport 2905 ip saddr != @cluster-cidrs jump mark-for-masquerade"},
		{6, r(addrIs{daddr, a4("2001:2::40")}, dport{sctp, 2905}, jump("mark-for-masquerade")), "ip6 daddr 2001:2::40 sctp dport 2905 jump mark-for-masquerade"},
		{6, r(addrIs{daddr, a4("2001:2::10")}, dport{tcp, 80}, notCIDRs, jump("mark-for-masquerade")), "ip6 daddr 2001:2::10 tcp dport 80 ip6 saddr != @cluster-cidrs jump mark-for-masquerade"},
		{4, r(numgenVmap{100, "wc-a"}), "numgen random mod 100 . meta l4proto vmap @wc-a"},
		{4, r(goTo("svc-a")), "goto svc-a"},
		{4, r(jump("mark-for-masquerade")), "jump mark-for-masquerade"},
	} {
		f := famOf(c.family)
		if got := c.r.text(f); got != c.want {
			t.Errorf("text %s, want %s", got, c.want)
		}
		es, err := c.r.encode(f)
		if err != nil {
			t.Fatalf("%s: %v", c.want, err)
		}
		sets := testSets(c.family)
		sets["cluster-cidrs"] = &nlSet{name: "cluster-cidrs", flags: unix.NFT_SET_INTERVAL, keyType: typeIPAddr, keyLen: 4}
		if c.family == 6 {
			sets["cluster-cidrs"].keyType, sets["cluster-cidrs"].keyLen = typeIP6Addr, 16
		}
		pr := printer{family: c.family, set: func(n string) *nlSet { return sets[n] }}
		got, rf := pr.rule(exprs(t, c.family, es...), nil)
		if got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
		if m := reGoto.FindStringSubmatch(c.want); m != nil && (len(rf.chains) != 1 || rf.chains[0] != m[1]) {
			t.Errorf("%s: chains named %v", c.want, rf.chains)
		}
	}
}

// TestPrintUnknown: sequences the printer does not know print as a text
// none of explain's patterns read, so explain reports them.
func TestPrintUnknown(t *testing.T) {
	l4 := func(reg uint32) *expr.Meta { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }
	gotoC := func(c string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: c} }
	for name, es := range map[string][]expr.Any{
		"quota before goto":   {&expr.Quota{Bytes: 100}, gotoC("svc-a")},
		"iifname before goto": {&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpEq(1, []byte("eth0\x00")), gotoC("svc-a")},
		"ip protocol":         {payload(nh, 9, 1, 1), cmpEq(1, []byte{6}), gotoC("svc-a")},
		// The split without nft's byteorder steps misses in the map.
		"numgen vmap without byteorder": {&expr.Numgen{Register: 1, Modulus: 100, Type: unix.NFT_NG_RANDOM}, l4(9),
			&expr.Lookup{SourceRegister: 1, SetName: "wc-a", IsDestRegSet: true}},
		"numgen inc": {&expr.Numgen{Register: 1, Modulus: 100, Type: unix.NFT_NG_INCREMENTAL},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
			l4(9), &expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Size: 2, Len: 1},
			&expr.Lookup{SourceRegister: 1, SetName: "wc-a", IsDestRegSet: true}},
		"dnat without port": {l4(1), cmpEq(1, []byte{6}), &expr.Immediate{Register: 1, Data: ip4("198.19.1.2")},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}},
		"snat": {&expr.Immediate{Register: 1, Data: ip4("198.19.1.2")}, &expr.Immediate{Register: 2, Data: be16(80)},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}},
		"address loaded, never compared": {payload(nh, 12, 4, 1), gotoC("svc-a")},
		"th dport without protocol":      {payload(th, 2, 2, 1), cmpEq(1, be16(80)), gotoC("svc-a")},
		"lookup of a missing set":        {payload(nh, 12, 4, 1), &expr.Lookup{SourceRegister: 1, SetName: "nope"}, gotoC("svc-a")},
		"fib daddr":                      {&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true}, cmpEq(1, ne32(unix.RTN_LOCAL)), gotoC("svc-a")},
	} {
		got, rf := testPrinter(4).rule(exprs(t, 4, es...), nil)
		if !strings.HasPrefix(got, "unknown: ") || len(rf.chains) > 0 {
			t.Errorf("%s: printed %q (chains %v)", name, got, rf.chains)
		}
		for _, re := range []interface{ MatchString(string) bool }{reGoto, reDNAT, reNumgen, reAffinity, reRanges} {
			if re.MatchString(got) {
				t.Errorf("%s: %q matches an explain pattern", name, got)
			}
		}
		for _, s := range []string{"@" + setClusterCIDRs + " goto", "jump " + chainMarkMasq, "masquerade", "meta mark set"} {
			if strings.Contains(got, s) {
				t.Errorf("%s: %q contains %q", name, got, s)
			}
		}
		if strings.HasPrefix(got, "fib saddr type local") {
			t.Errorf("%s: %q", name, got)
		}
	}
}

// verdictBytes is NFTA_DATA_VERDICT's content: the verdict code and
// the chain, as netlink attributes.
func verdictBytes(t *testing.T, code int32, chain string) []byte {
	t.Helper()
	put := func(b []byte, typ uint16, v []byte) []byte {
		b = binary.NativeEndian.AppendUint16(b, uint16(4+len(v)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, v...)
		return append(b, make([]byte, (4-len(v)%4)%4)...)
	}
	b := put(nil, unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(code)))
	if chain != "" {
		b = put(b, unix.NFTA_VERDICT_CHAIN, []byte(chain+"\x00"))
	}
	return b
}

func TestPrintElements(t *testing.T) {
	pad := func(b ...byte) []byte { return append(b, make([]byte, (4-len(b)%4)%4)...) }
	ng := func(v uint32, proto byte) []byte { return append(binary.BigEndian.AppendUint32(nil, v), pad(proto)...) }
	sets := testSets(4)
	join := func(es []snapElem) string {
		var out []string
		for _, e := range es {
			s := strings.Join(e.key, " . ")
			if e.comment != "" {
				s += ` comment "` + e.comment + `"`
			}
			if e.value != "" {
				s += " : " + e.value
			}
			out = append(out, s)
		}
		return strings.Join(out, ", ")
	}
	pr := testPrinter(4)
	for _, c := range []struct {
		set  *nlSet
		es   []nlElem
		want string
	}{
		{sets["cluster-cidrs"], []nlElem{{key: ip4("198.19.128.0"), flags: 1}, {key: ip4("198.19.0.0")}, {key: ip4("0.0.0.0"), flags: 1}}, "198.19.0.0/17"},
		{sets["cluster-cidrs"], []nlElem{{key: ip4("0.0.0.0")}}, "0.0.0.0/0"},
		{sets["nodeport-ips"], []nlElem{{key: ip4("198.19.254.1")}, {key: ip4("198.19.0.1")}}, "198.19.0.1, 198.19.254.1"},
		{sets["hairpin"], []nlElem{{key: append(ip4("198.19.1.2"), ip4("198.19.1.2")...)}}, "198.19.1.2 . 198.19.1.2"},
		{sets["service-ips"], []nlElem{{key: append(append(ip4("198.18.0.10"), pad(6)...), pad(0, 80)...), comment: "ns/a:http",
			verdict: verdictBytes(t, int32(expr.VerdictGoto), "svc-a")}}, `198.18.0.10 . tcp . 80 comment "ns/a:http" : goto svc-a`},
		{sets["service-nodeports"], []nlElem{{key: append(pad(17), pad(0x75, 0x31)...), comment: "ns/a:dns node port",
			verdict: verdictBytes(t, int32(expr.VerdictDrop), "")}}, `udp . 30001 comment "ns/a:dns node port" : drop`},
		{sets["wc-a"], []nlElem{
			{key: ng(10, 6), keyEnd: ng(99, 6), verdict: verdictBytes(t, int32(expr.VerdictReturn), "")},
			{key: ng(0, 6), keyEnd: ng(9, 6), verdict: verdictBytes(t, int32(expr.VerdictGoto), "ep-a")},
			{key: ng(100, 6), keyEnd: ng(100, 6), verdict: verdictBytes(t, int32(expr.VerdictReturn), "")},
		}, "0-9 . tcp : goto ep-a, 10-99 . tcp : return, 100 . tcp : return"},
		{sets["wd-a"], []nlElem{
			{key: ng(0, 6), keyEnd: ng(499999, 6), data: append(ip4("198.19.0.5"), pad(0x1f, 0x90)...)},
			{key: ng(500000, 6), keyEnd: ng(999999, 6), data: append(ip4("198.19.0.6"), pad(0x1f, 0x91)...)},
		}, "0-499999 . tcp : 198.19.0.5 . 8080, 500000-999999 . tcp : 198.19.0.6 . 8081"},
		// SCTP (132) in every map that carries the protocol.
		{sets["service-ips"], []nlElem{{key: append(append(ip4("198.18.0.40"), pad(132)...), pad(0x0b, 0x59)...), comment: "ns/s:sig",
			verdict: verdictBytes(t, int32(expr.VerdictGoto), "svc-s")}}, `198.18.0.40 . sctp . 2905 comment "ns/s:sig" : goto svc-s`},
		{sets["service-nodeports"], []nlElem{{key: append(pad(132), pad(0x78, 0xa1)...), comment: "ns/s:sig node port",
			verdict: verdictBytes(t, int32(expr.VerdictGoto), "ext-s")}}, `sctp . 30881 comment "ns/s:sig node port" : goto ext-s`},
		{sets["wd-a"], []nlElem{
			{key: ng(0, 132), keyEnd: ng(99999, 132), data: append(ip4("198.19.30.2"), pad(0x0b, 0x59)...)},
			{key: ng(100000, 132), keyEnd: ng(999999, 132), data: append(ip4("198.19.30.3"), pad(0x0b, 0x59)...)},
		}, "0-99999 . sctp : 198.19.30.2 . 2905, 100000-999999 . sctp : 198.19.30.3 . 2905"},
		// An integer key nft did not declare as numgen: not guessed.
		{&nlSet{name: "x", flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: verdictMagic, dataLen: 16},
			[]nlElem{{key: ng(0, 6), keyEnd: ng(9, 6), verdict: verdictBytes(t, int32(expr.VerdictReturn), "")}}, "unknown element"},
	} {
		if got := join(pr.elements0(c.set, c.es)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.set.name, got, c.want)
		}
	}
	six := testSets(6)
	got := join(testPrinter(6).elements0(six["wd-a"], []nlElem{{key: ng(0, 6), keyEnd: ng(999999, 6),
		data: append(netip.MustParseAddr("2001:2::1:2").AsSlice(), pad(0x1f, 0x90)...)}}))
	if want := "0-999999 . tcp : 2001:2::1:2 . 8080"; got != want {
		t.Errorf("ip6 data map:\n got %s\nwant %s", got, want)
	}
}
