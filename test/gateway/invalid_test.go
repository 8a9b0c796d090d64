//go:build gateway

package gateway

import (
	"math"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestInvalidBackendShareRefused: a TCPRoute and a UDPRoute whose
// backendRefs are a valid Service and a missing one, weights 1:1. The spec
// says the invalid backend keeps its share and its connections fail: about
// half of the new connections must fail (TCP: refused by a reset; UDP: an
// ICMP port unreachable, rate-limited by the kernel), not all go to the
// valid Service. Real connections, in
// the iptables and nftables modes.
func TestInvalidBackendShareRefused(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t)
			a := backend{"a", "198.19.5.2"}
			e.addPods(a)
			e.service(testNS, "s1", "198.18.0.50", nil, a)
			e.startAgent("--mode", mode)

			e.newGateway("gw", listener("tcp", gwv1.TCPProtocolType, 80), listener("udp", gwv1.UDPProtocolType, 80))
			e.tcpRoute(testNS, "half", []gwv1.ParentReference{gatewayParent("gw", "tcp")}, ref("", "s1", 1), ref("", "missing", 1))
			e.udpRoute(testNS, "half", []gwv1.ParentReference{gatewayParent("gw", "udp")}, ref("", "s1", 1), ref("", "missing", 1))
			addr := e.gatewayAddress("gw")
			waitCondition(t, "TCPRoute half", "ResolvedRefs", metav1.ConditionFalse, "BackendNotFound", e.tcpRouteConds(testNS, "half", "gw"))
			for _, proto := range []dataplane.Protocol{dataplane.TCP, dataplane.UDP} {
				_, v := e.waitShares(addr.String(), proto, map[string]float64{a.ip: 50}, 15*time.Second)
				if math.Abs(v.RejectShare-50) > 0.01 {
					t.Errorf("explain %s: %s, want reject 50%%", proto, v.Line())
				}
				t.Logf("explain: %s", v.Line())
			}
			e.waitVerify()

			// 40,000 TCP connections at 1:1: sigma sqrt(.25/40000) = 0.25
			// points, so 1 point is 4 sigma. 128 at once: a refusal once
			// took a second in the iptables mode (the reject share of an
			// off-cluster client was forwarded instead of refused).
			const tcpN = 40000
			r, err := e.client.TCPConns(netip.AddrPortFrom(addr, 80), tcpN, sandbox.Load{Concurrency: 128, MaxDuration: 5 * time.Minute})
			if err != nil {
				t.Fatalf("%v: %v", err, r)
			}
			expectRefused(t, r, "a", 50, sandbox.ShareTolerance(50, tcpN, 4))
			// 5,000 UDP flows: the answered share within 4.5 sigma (3.2
			// points). A refused flow gets an ICMP port unreachable, which
			// the kernel rate-limits (one a second per client), so the
			// others are refused or unanswered: failed either way, after
			// the 500 ms timeout, hence 128 at once.
			const udpN = 5000
			u, err := e.client.UDPFlows(netip.AddrPortFrom(addr, 80), udpN, sandbox.Load{Concurrency: 128, Timeout: 500 * time.Millisecond})
			if err != nil {
				t.Fatalf("%v: %v", err, u)
			}
			t.Logf("%v", u)
			tol := sandbox.ShareTolerance(50, udpN, 4.5)
			if got := 100 * float64(u.Counts["a"]) / float64(max(u.Attempted, 1)); math.Abs(got-50) > tol || len(u.Counts) != 1 || u.Attempted != udpN {
				t.Errorf("UDP: a answered %.2f%% of %d flows, want 50%% within %.1f points: %v", got, u.Attempted, tol, u)
			}
		})
	}
}

// expectRefused checks that pod answered about share percent of the
// attempted connections and that every other one was refused (a reset: a
// timeout is a failure too), none answered by anyone else.
func expectRefused(t *testing.T, r sandbox.Result, pod string, share, tol float64) {
	t.Helper()
	t.Logf("%v", r)
	n := float64(max(r.Attempted, 1))
	answered := 100 * float64(r.Counts[pod]) / n
	failed := 100 * float64(r.Failed()) / n
	refused := 100 * float64(r.Errors["connection refused"]) / n
	t.Logf("  %s answered %.2f%% (configured %.0f%%), failed %.2f%% (configured %.0f%%; refused %.2f%%), of %d", pod, answered, share, failed, 100-share, refused, r.Attempted)
	if math.Abs(answered-share) > tol || math.Abs(failed-(100-share)) > tol {
		t.Errorf("answered %.2f%% failed %.2f%%, want %.0f/%.0f within %.2f points", answered, failed, share, 100-share, tol)
	}
	if n := r.Errors["connection refused"]; n != r.Failed() {
		t.Errorf("%d of %d failed connections were not refused: %v", r.Failed()-n, r.Failed(), r.Errors)
	}
	if len(r.Counts) > 1 || r.Attempted != r.Requested {
		t.Errorf("connections answered by another pod, or not attempted: %v", r)
	}
}
