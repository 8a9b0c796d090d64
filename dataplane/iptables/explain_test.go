package iptables

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The hairpin check traces with Reach.TraceTo, which enters only the
// chains that can lead back to the backend: on rendered rules (hairpin
// marks, Local policy, affinity, source ranges, a reject share) it must
// give each backend the share and mark the full trace gives it, from
// every chain of the Service port. IP plan: parity_test.go's.
func TestHairpinTraceAgreesWithFullTrace(t *testing.T) {
	plain := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, localBe("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90), be("198.19.1.4", 8080, 5))
	rich := svcPort("ns", "rich", "http", "198.18.0.11", 80, dataplane.TCP, localBe("198.19.1.5", 8080, 10), be("198.19.1.6", 8080, 90))
	rich.NodePort = 30080
	rich.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.10")}
	rich.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.254.0/24")}
	rich.ExternalLocal, rich.InternalLocal, rich.AffinitySeconds = true, true, 30
	gw := svcPort("ns", "gw", "tcp", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.7", 8080, 1), be("198.19.1.8", 8080, 3))
	gw.RejectWeight = 1
	s := dataplane.State{Services: []dataplane.ServicePort{plain, rich, gw}}
	rs, _ := paritySync(t, s)
	reach := rs.NewReach(TableNAT)
	checked := 0
	for _, sp := range s.Services {
		for _, c := range rs.SteelyardChains(TableNAT) {
			if !strings.HasPrefix(string(c), svcPrefix) && !strings.HasPrefix(string(c), svlPrefix) && !strings.HasPrefix(string(c), extPrefix) && !strings.HasPrefix(string(c), fwPrefix) {
				continue
			}
			for _, b := range sp.Backends {
				p := Packet{Src: b.IP, Dst: sp.VIP.IP, Protocol: "tcp", DPort: int(sp.VIP.Port)}
				full, err := rs.Trace(TableNAT, c, p)
				if err != nil {
					t.Fatal(err)
				}
				to, err := reach.TraceTo(c, p, b.IP)
				if err != nil {
					t.Fatal(err)
				}
				want, got := dnatTo(full, b.IP), dnatTo(to, b.IP)
				if len(want) != len(got) {
					t.Fatalf("%s from %s: TraceTo %+v, Trace %+v", c, b.IP, got, want)
				}
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("%s from %s: TraceTo %+v, Trace %+v", c, b.IP, got[i], want[i])
					}
				}
				checked += len(want)
			}
		}
	}
	t.Logf("%d outcomes compared", checked)
	if checked == 0 {
		t.Fatal("no backend reached: the test checks nothing")
	}
}

func dnatTo(outs []Outcome, dst netip.Addr) []Outcome {
	var out []Outcome
	for _, o := range outs {
		if o.Verdict == "DNAT" && o.DNAT.Addr() == dst {
			out = append(out, o)
		}
	}
	return out
}
