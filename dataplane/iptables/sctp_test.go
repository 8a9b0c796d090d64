package iptables

// SCTP Services: the rules name the protocol (-p sctp -m sctp --dport), and
// the tracer, walking the parsed rules, finds the weights and masquerade of
// every entry point for SCTP packets and nothing for TCP ones. IP plan as in
// parity_test.go.

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

func TestSCTPEveryEntryPoint(t *testing.T) {
	sp := svcPort("ns", "sig", "sig", "198.18.0.12", 2905, dataplane.SCTP, be("198.19.1.2", 2905, 10), be("198.19.1.3", 2905, 90))
	sp.NodePort = 30905
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.10")}
	empty := svcPort("ns", "gone", "sig", "198.18.0.13", 2905, dataplane.SCTP)
	st := dataplane.State{Services: []dataplane.ServicePort{sp, empty}}

	f := NewFake()
	if _, err := NewProxier(f, parityCfg).Sync(st, dataplane.FullSync); err != nil {
		t.Fatalf("sync: %v", err)
	}
	restore := string(f.LastRestore)
	for _, want := range []string{
		`-A STEELYARD-SERVICES -d 198.18.0.12/32 -p sctp -m comment --comment "ns/sig:sig" -m sctp --dport 2905 -j `,
		`-A STEELYARD-NODEPORTS -p sctp -m comment --comment "ns/sig:sig node port" -m sctp --dport 30905 -j `,
		`-A STEELYARD-SERVICES -d 198.18.0.13/32 -p sctp -m comment --comment "ns/gone:sig has no endpoints" -m sctp --dport 2905 -j REJECT --reject-with icmp-port-unreachable`,
		`-p sctp -m comment --comment "ns/sig:sig" -m sctp -j DNAT --to-destination 198.19.1.2:2905`,
	} {
		if !strings.Contains(restore, want) {
			t.Errorf("restore lacks %q:\n%s", want, restore)
		}
	}
	if strings.Contains(restore, "-p tcp") || strings.Contains(restore, "-p udp") {
		t.Errorf("an SCTP-only state rendered TCP or UDP rules:\n%s", restore)
	}

	rs, views := paritySync(t, st)
	for _, k := range []string{"198.18.0.12:2905/SCTP", "0.0.0.0:30905/SCTP", "198.18.1.10:2905/SCTP", "198.18.0.13:2905/SCTP"} {
		if _, ok := views[k]; !ok {
			t.Errorf("explain has no %s (has %v)", k, keysOf(views))
		}
	}
	if v := views["198.18.0.13:2905/SCTP"]; !v.Reject {
		t.Errorf("empty SCTP Service not rejected: %+v", v)
	}
	split := map[string]float64{"198.19.1.2:2905": 10, "198.19.1.3:2905": 90}
	for _, c := range []struct {
		proto string
		tc    traceCase
	}{
		{"sctp", traceCase{"clusterIP from a pod", "198.19.1.9", "198.18.0.12", 2905, false, false, split, "none"}},
		{"sctp", traceCase{"clusterIP from off-cluster", "198.19.254.2", "198.18.0.12", 2905, false, false, split, "all"}},
		{"sctp", traceCase{"node port on the LAN address", "198.19.254.2", "198.19.254.1", 30905, false, true, split, "all"}},
		{"sctp", traceCase{"node port from the node itself", "198.19.254.1", "198.19.254.1", 30905, true, true, split, "all"}},
		{"sctp", traceCase{"external IP", "198.19.254.2", "198.18.1.10", 2905, false, false, split, "all"}},
		{"sctp", traceCase{"no endpoints: rejected", "198.19.1.9", "198.18.0.13", 2905, false, false, map[string]float64{"REJECT": 100}, "none"}},
		// The same port numbers in TCP and UDP are other Services.
		{"tcp", traceCase{"TCP to the SCTP VIP: untouched", "198.19.1.9", "198.18.0.12", 2905, false, false, map[string]float64{"ACCEPT": 100}, "none"}},
		{"udp", traceCase{"UDP to the SCTP node port: untouched", "198.19.254.2", "198.19.254.1", 30905, false, true, map[string]float64{"ACCEPT": 100}, "none"}},
	} {
		t.Run(c.tc.name, func(t *testing.T) { traceCheck(t, rs, c.proto, c.tc) })
	}
	// Hairpin: an endpoint reaching itself through the VIP is masqueraded.
	outs, err := rs.Trace(TableNAT, "PREROUTING", Packet{Src: netip.MustParseAddr("198.19.1.2"), Dst: netip.MustParseAddr("198.18.0.12"), Protocol: "sctp", DPort: 2905})
	if err != nil {
		t.Fatal(err)
	}
	hairpin := 0
	for _, o := range outs {
		if o.DNAT == netip.MustParseAddrPort("198.19.1.2:2905") {
			hairpin++
			if o.Mark&masqBit == 0 {
				t.Errorf("hairpin SCTP connection not masqueraded: %+v", o)
			}
		}
	}
	if hairpin == 0 {
		t.Errorf("no trace of an endpoint reaching itself through the VIP: %+v", outs)
	}
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
