package nftables

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// modelSets describes the sets and maps a rendered rule may look up, as
// the kernel would (for the printer of explain_netlink_print.go).
func modelSets(family int) func(string) *nlSet {
	base := testSets(family)
	addr, alen := uint32(typeIPAddr), uint32(4)
	if family == 6 {
		addr, alen = typeIP6Addr, 16
	}
	return func(n string) *nlSet {
		if s, ok := base[n]; ok {
			return s
		}
		switch {
		case strings.HasPrefix(n, dnatPrefix), strings.HasPrefix(n, countPrefix):
			return &nlSet{name: n, flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: addr<<6 | typeInetServ, dataLen: alen + 4, userdata: numgenUD}
		case strings.HasPrefix(n, wPrefix):
			return &nlSet{name: n, flags: 0x8c, keyType: 0x10c, keyLen: 8, dataType: verdictMagic, dataLen: 16, userdata: numgenUD}
		case strings.HasPrefix(n, affPrefix):
			return &nlSet{name: n, flags: 0x30, keyType: addr, keyLen: alen, timeoutMS: 600000, hasTimeout: true}
		}
		return nil
	}
}

// TestRenderedRulesEncodeAsTheirText: every rule render writes, for every
// Service shape of the parity table in both families, either encodes for
// netlink into expressions that print back as exactly the model's text,
// or has a statement only nft writes (errUnsupported). So the nft and
// netlink writers, both fed from the model, write the same rule.
func TestRenderedRulesEncodeAsTheirText(t *testing.T) {
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
			pr := printer{family: family, set: modelSets(family)}
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
						got, _ := pr.rule(exprs(t, family, es...), nil)
						if got != want {
							t.Errorf("IPv%d rule encodes as\n  %s\nits text is\n  %s", family, got, want)
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
