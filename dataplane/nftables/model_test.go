package nftables

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// listed encodes es as the kernel lists a rule's expressions
// (NFTA_RULE_EXPRESSIONS) and decodes them as the reader does.
func listed(t *testing.T, f fam, es ...expr.Any) []kexpr {
	t.Helper()
	var b []byte
	for _, e := range es {
		m, err := expr.Marshal(byte(f.nfproto()), e)
		if err != nil {
			t.Fatal(err)
		}
		n := 4 + len(m)
		b = binary.NativeEndian.AppendUint16(b, uint16(n))
		b = binary.NativeEndian.AppendUint16(b, unix.NFTA_LIST_ELEM|unix.NLA_F_NESTED)
		b = append(append(b, m...), make([]byte, (4-n%4)%4)...)
	}
	out, err := decodeExprs(byte(f.nfproto()), b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// noAnon: no anonymous sets.
func noAnon(string) ([]netip.Prefix, bool) { return nil, false }

// TestDecodeRendered: every rule render writes, for every Service shape of
// the parity table in both families, either encodes for netlink into
// expressions that the reader decodes back into the same statements
// (through the kernel's listing format and google/nftables' decoders,
// byteorder by the adapter), or has a statement only nft writes
// (errUnsupported). TestNetlinkMatchesNft checks that the encoding is
// nft's, so Explain reads what either writer wrote.
func TestDecodeRendered(t *testing.T) {
	a := netip.MustParseAddr
	shapes := func(family int) []dataplane.ServicePort {
		vip, ext, lb, p1, p2, p3 := "198.18.0.10", "198.18.1.1", "198.18.2.1", "198.19.1.2", "198.19.1.3", "198.19.1.4"
		rng := netip.MustParsePrefix("198.19.128.0/24")
		if family == 6 {
			vip, ext, lb, p1, p2, p3 = "2001:2::10", "2001:2::1:1", "2001:2::2:1", "2001:2::3:2", "2001:2::3:3", "2001:2::3:4"
			rng = netip.MustParsePrefix("2001:2::ff:0/120")
		}
		mk := func(proto dataplane.Protocol, f func(*dataplane.ServicePort)) dataplane.ServicePort {
			sp := svcPort("w", vip, 80, proto, be(p1, 8080, 1), local(be(p2, 8080, 3)), be(p3, 8080, 6))
			sp.NodePort = 30080
			f(&sp)
			return sp
		}
		return []dataplane.ServicePort{
			mk(dataplane.TCP, func(sp *dataplane.ServicePort) {}),
			mk(dataplane.UDP, func(sp *dataplane.ServicePort) { sp.ExternalIPs = []netip.Addr{a(ext)} }),
			mk(dataplane.SCTP, func(sp *dataplane.ServicePort) {
				sp.LoadBalancerIPs, sp.SourceRanges = []netip.Addr{a(lb)}, []netip.Prefix{rng}
			}),
			mk(dataplane.TCP, func(sp *dataplane.ServicePort) { sp.ExternalLocal = true }),
			mk(dataplane.TCP, func(sp *dataplane.ServicePort) { sp.InternalLocal = true }),
			mk(dataplane.TCP, func(sp *dataplane.ServicePort) { sp.AffinitySeconds = 600 }),
			mk(dataplane.TCP, func(sp *dataplane.ServicePort) { sp.AffinitySeconds = 600; sp.RejectWeight = 2 }),
			mk(dataplane.UDP, func(sp *dataplane.ServicePort) { sp.RejectWeight = 2 }),
		}
	}
	encoded := map[string]int{}
	for _, family := range []int{4, 6} {
		for _, all := range []bool{false, true} {
			p, _ := newTest(t, family)
			p.cfg.MasqueradeAll = all
			for _, sp := range shapes(family) {
				o := p.renderPort(&sp)
				for _, c := range o.order {
					for _, rl := range o.chains[c] {
						want := rl.text(p.f)
						es, err := rl.encode(p.f)
						if err != nil {
							var u errUnsupported
							if !errors.As(err, &u) {
								t.Errorf("%s: %v", want, err)
							}
							continue
						}
						got := decodeRule(p.f, listed(t, p.f, es...), noAnon)
						if !rulesEqual([]rule{got}, []rule{rl}) {
							t.Errorf("IPv%d rule decodes as\n  %s\nit is\n  %s", family, got.text(p.f), want)
						}
						encoded[c[:strings.Index(c, "-")+1]]++
					}
				}
			}
		}
	}
	// The rules of endpoint and weight changes go over netlink: the split
	// chains' (masquerade check, affinity, DNAT-map or verdict-map draw)
	// and the endpoint chains' hairpin mark and DNAT.
	for _, pfx := range []string{svcPrefix, svlPrefix, epPrefix} {
		if encoded[pfx] == 0 {
			t.Errorf("no rule of a %s chain encoded for netlink: %v", pfx, encoded)
		}
	}
}

// TestNftOnlyStatementsRefuseNetlink: what only nft writes never reaches
// the netlink writer, whose transaction then goes through nft.
func TestNftOnlyStatementsRefuseNetlink(t *testing.T) {
	f := famOf(4)
	for _, rl := range []rule{
		r(fibLocal, jump(chainMarkMasq)),
		r(updateSaddr("af-a")),
		r(srcRanges{netip.MustParsePrefix("198.19.128.0/24")}, goTo("ext-a")),
		r(nftOnly("reject")),
		r(vDrop),
		r(addrIs{saddr, netip.MustParseAddr("2001:2::1")}, jump(chainMarkMasq)), // the other family
	} {
		if _, err := rl.encode(f); !errors.As(err, new(errUnsupported)) {
			t.Errorf("%s: encoded (%v)", rl.text(f), err)
		}
	}
}
