package nftables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// SCTP Services: the shared maps key them by "meta l4proto . th dport"
// with sctp, the masquerade rule matches "sctp dport", the hairpin set
// carries sctp, and explain reads every entry point back as SCTP. A TCP
// Service on the same address and port number stays apart.
func TestSCTPEveryEntryPoint(t *testing.T) {
	for _, family := range []int{4, 6} {
		vip, ext, pod1, pod2 := "198.18.0.40", "198.18.1.40", "198.19.30.2", "198.19.30.3"
		if family == 6 {
			vip, ext, pod1, pod2 = "2001:2::40", "2001:2::1:40", "2001:2::30:2", "2001:2::30:3"
		}
		p, nft := newTest(t, family)
		p.NodeAddresses = func() []netip.Addr {
			if family == 6 {
				return []netip.Addr{netip.MustParseAddr("2001:2::fe:1")}
			}
			return []netip.Addr{netip.MustParseAddr("198.19.200.1")}
		}
		sig := svcPort("sig", vip, 2905, dataplane.SCTP, be(pod1, 2905, 10), be(pod2, 2905, 90))
		sig.NodePort = 30905
		sig.ExternalIPs = []netip.Addr{netip.MustParseAddr(ext)}
		ctl := svcPort("ctl", vip, 2905, dataplane.TCP, be(pod1, 2905, 1))
		ctl.Name.Port = "ctl"
		gone := svcPort("gone", vip, 2906, dataplane.SCTP)
		s := dataplane.State{Services: []dataplane.ServicePort{sig, ctl, gone}}
		s.Sort()
		if _, err := p.Sync(s, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		wantServed(t, fmt.Sprintf("IPv%d", family), p, s)
		// Explain names the same entry points.
		live, err := p.Explain()
		if err != nil {
			t.Fatal(err)
		}
		keys := map[string]bool{}
		for _, v := range live {
			keys[v.Key()] = true
		}
		for _, k := range []string{vip + ":2905/SCTP", vip + ":2905/TCP", ext + ":2905/SCTP", vip + ":2906/SCTP"} {
			if family == 6 {
				k = "[" + strings.Replace(k, ":29", "]:29", 1)
			}
			if !keys[k] {
				t.Errorf("IPv%d: explain has no %s: %v", family, k, keys)
			}
		}
		dump := nft.(*knftables.Fake).Dump()
		wants := []string{
			vip + " . sctp . 2905 comment",
			vip + " . tcp . 2905 comment",
			"sctp . 30905 comment",
			pod1 + " . sctp . 2905 . " + pod1,
			"meta l4proto sctp dnat",
		}
		if family == 4 {
			// Off-cluster clients of the clusterIP (testCfg has an IPv4
			// cluster CIDR only).
			wants = append(wants, " daddr "+vip+" sctp dport 2905 ip saddr != @cluster-cidrs jump mark-for-masquerade")
		}
		for _, want := range wants {
			if !strings.Contains(dump, want) {
				t.Errorf("IPv%d: table lacks %q:\n%s", family, want, dump)
			}
		}
	}
}
