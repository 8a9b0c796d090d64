//go:build e2e

package e2e

// kube-proxy parity in nftables mode against the real kernel, row by row of
// the README's Service features table: node ports, external and
// load-balancer IPs with source ranges, traffic policies Local with their
// drops, ClientIP affinity, reject without endpoints, hairpin; shares
// through every entry point within 1 point of the weights.
//
// IP plan (see parity_test.go): Services 198.18.0.60 .. 198.18.0.69,
// external IP 198.18.1.60, load-balancer IP 198.18.2.60, pods 198.19.60.x ..
// 198.19.64.x, clients 198.19.254.2 and 198.19.254.200 (outside the source
// ranges).

import (
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// nftConns is conns with a concurrency that keeps 40,000 connections
// within seconds.
func nftConns(t *testing.T, ns *sandbox.NS, what string, dst netip.AddrPort, count int, want map[string]float64, tol float64) {
	t.Helper()
	start := time.Now()
	r, err := ns.TCPConnsAny(dst, count, sandbox.Load{Concurrency: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%s), %s: %s", what, dst, time.Since(start).Round(time.Millisecond), r)
	sandbox.ExpectShares(t, r, want, tol)
}

func refusedConn(t *testing.T, ns *sandbox.NS, what string, dst netip.AddrPort) {
	t.Helper()
	_, err := ns.FirstLine(netip.Addr{}, dst, 2*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%s: %s: %v, want ECONNREFUSED", what, dst, err)
	}
}

// TestNftParityEntryPoints: within 1 point of the weights on every entry
// point, 10/90 on 20,000 connections (sigma(10%) = 0.21 points: 1 point is
// 4.7 sigma) and 1:2:3:4 on 40,000 (sigma(40%) = 0.24 points), through the
// clusterIP, the node port (from a client and from the node), the external
// IP and the load-balancer IP; then the source-range drop and hairpin.
func TestNftParityEntryPoints(t *testing.T) {
	lb := pService{
		name: "nlb", clusterIPs: []string{"198.18.0.60"}, port: 80, targetPort: 8080, weights: "nlb-1=10,nlb-2=90",
		endpoints: []pEndpoint{{name: "nlb-1", ip: "198.19.60.2"}, {name: "nlb-2", ip: "198.19.60.3", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30160
			s.Spec.ExternalIPs = []string{"198.18.1.60"}
			s.Spec.LoadBalancerSourceRanges = []string{"198.19.254.0/25"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.2.60"}}
		},
	}
	four := pService{
		name: "nfour", clusterIPs: []string{"198.18.0.61"}, port: 80, targetPort: 8080, weights: "nf-1=1,nf-2=2,nf-3=3,nf-4=4",
		endpoints: []pEndpoint{{name: "nf-1", ip: "198.19.61.2"}, {name: "nf-2", ip: "198.19.61.3"}, {name: "nf-3", ip: "198.19.61.4"}, {name: "nf-4", ip: "198.19.61.5"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30161
		},
	}
	f := newFixture(t, modeNamed(t, "nftables"))
	outsider, err := f.sb.AddClient(netip.MustParseAddr("198.19.254.200"))
	if err != nil {
		t.Fatal(err)
	}
	f.addSourcePods(lb, four)
	f.writeParity("nlb.yaml", lb, four)
	f.start()

	views := f.explain()
	split := map[string]float64{"198.19.60.2": 10, "198.19.60.3": 90}
	for _, key := range []string{"198.18.0.60:80/TCP", "0.0.0.0:30160/TCP", "198.18.1.60:80/TCP", "198.18.2.60:80/TCP"} {
		v := findView(t, views, key)
		t.Logf("explain: %s", v.Line())
		if got := viewcheck.Shares(&v); !viewcheck.Same(got, split) {
			t.Errorf("explain %s: %v, want %v", key, got, split)
		}
	}
	if v := findView(t, views, "198.18.2.60:80/TCP"); strings.Join(v.SourceRanges, ",") != "198.19.254.0/25" {
		t.Errorf("explain: source ranges %v", v.SourceRanges)
	}

	byName := map[string]float64{"nlb-1": 10, "nlb-2": 90}
	nftConns(t, f.client, "clusterIP 10/90", ap("198.18.0.60:80"), 20000, byName, 1)
	nftConns(t, f.client, "clusterIP 1:2:3:4", ap("198.18.0.61:80"), 40000, map[string]float64{"nf-1": 10, "nf-2": 20, "nf-3": 30, "nf-4": 40}, 1)
	nftConns(t, f.client, "node port", ap("198.19.254.1:30160"), 20000, byName, 1)
	nftConns(t, f.sb.Node, "node port from the node itself", ap("198.19.254.1:30160"), 20000, byName, 1)
	nftConns(t, f.client, "node port 1:2:3:4", ap("198.19.254.1:30161"), 40000, map[string]float64{"nf-1": 10, "nf-2": 20, "nf-3": 30, "nf-4": 40}, 1)
	nftConns(t, f.client, "external IP", ap("198.18.1.60:80"), 20000, byName, 1)
	nftConns(t, f.client, "load-balancer IP, allowed source", ap("198.18.2.60:80"), 20000, byName, 1)
	nftConns(t, outsider, "external IP from outside the source ranges", ap("198.18.1.60:80"), 500, byName, 6)
	dropped(t, outsider, "load-balancer IP from outside loadBalancerSourceRanges", ap("198.18.2.60:80"))
	// Hairpin: a pod reaching itself through the VIP is answered (it sees
	// the node's address, so its reply is un-DNATed).
	hp := f.sb.Pod("nlb-1").NS
	r, err := hp.TCPConnsAny(ap("198.18.0.60:80"), 300, sandbox.Load{})
	if err != nil || r.Failed() > 0 || r.Counts["nlb-1"] == 0 {
		t.Errorf("hairpin: %v %v", r, err)
	}
	// Cluster policy masquerades: the pod does not see the client.
	line, err := f.client.FirstLine(netip.Addr{}, ap("198.19.254.1:30160"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(line, " 198.19.254.2") {
		t.Errorf("cluster policy: the pod saw the client's address (%q)", line)
	}
}

// TestNftParityTrafficPolicies: externalTrafficPolicy Local splits external
// traffic over this node's endpoints by weight (25/75 on 30,000: sigma 0.25
// points, 1 point is 4 sigma) and keeps the client's
// address; without local endpoints external traffic is dropped, and
// internalTrafficPolicy Local without local endpoints drops the clusterIP.
func TestNftParityTrafficPolicies(t *testing.T) {
	etp := pService{
		name: "netp", clusterIPs: []string{"198.18.0.62"}, port: 80, targetPort: 8080, weights: "ne-1=1,ne-2=3,ne-3=6",
		endpoints: []pEndpoint{{name: "ne-1", ip: "198.19.62.2"}, {name: "ne-2", ip: "198.19.62.3"}, {name: "ne-3", ip: "198.19.62.4", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30162
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		},
	}
	none := pService{
		name: "nenone", clusterIPs: []string{"198.18.0.63"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{{name: "nn-1", ip: "198.19.63.2", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30163
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		},
	}
	itp := pService{
		name: "nitp", clusterIPs: []string{"198.18.0.64"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{{name: "ni-1", ip: "198.19.64.2", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		},
	}
	f := newFixture(t, modeNamed(t, "nftables"))
	f.addSourcePods(etp, none, itp)
	f.writeParity("netp.yaml", etp, none, itp)
	f.start()
	views := f.explain()
	for _, key := range []string{"0.0.0.0:30162/TCP", "0.0.0.0:30163/TCP", "198.18.0.64:80/TCP"} {
		t.Logf("explain: %s", findView(t, views, key).Line())
	}
	nftConns(t, f.client, "node port, policy Local", ap("198.19.254.1:30162"), 30000, map[string]float64{"ne-1": 25, "ne-2": 75}, 1)
	nftConns(t, f.client, "clusterIP of the same Service (Cluster internally)", ap("198.18.0.62:80"), 5000, map[string]float64{"ne-1": 10, "ne-2": 30, "ne-3": 60}, 2.5)
	line, err := f.client.FirstLine(netip.Addr{}, ap("198.19.254.1:30162"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(line, " 198.19.254.2") {
		t.Errorf("policy Local: the pod saw %q, want the client's address", line)
	}
	dropped(t, f.client, "node port, policy Local, no local endpoint", ap("198.19.254.1:30163"))
	dropped(t, f.client, "internalTrafficPolicy Local, no local endpoint", ap("198.18.0.64:80"))
}

// TestNftParityAffinityAndReject: ClientIP affinity keeps a client on one
// backend through the clusterIP and the node port (explain shows the
// timeout); a Service without endpoints is refused on every entry point.
func TestNftParityAffinityAndReject(t *testing.T) {
	aff := pService{
		name: "naff", clusterIPs: []string{"198.18.0.65"}, port: 80, targetPort: 8080, weights: "na-1=20,na-2=80",
		endpoints: []pEndpoint{{name: "na-1", ip: "198.19.65.2"}, {name: "na-2", ip: "198.19.65.3"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30165
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			sec := int32(60)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
		},
	}
	empty := pService{
		name: "nempty", clusterIPs: []string{"198.18.0.66"}, port: 80, targetPort: 8080,
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30166
		},
	}
	f := newFixture(t, modeNamed(t, "nftables"))
	f.addSourcePods(aff)
	f.writeParity("naff.yaml", aff, empty)
	f.start()
	views := f.explain()
	v := findView(t, views, "198.18.0.65:80/TCP")
	t.Logf("explain: %s", v.Line())
	if v.AffinitySeconds != 60 {
		t.Errorf("explain: affinity %d s, want 60", v.AffinitySeconds)
	}
	if e := findView(t, views, "0.0.0.0:30166/TCP"); !e.Reject {
		t.Errorf("explain: node port without endpoints: %s", e.Line())
	}
	var seen []string
	for _, dst := range []string{"198.18.0.65:80", "198.19.254.1:30165"} {
		r, err := f.client.TCPConnsAny(ap(dst), 200, sandbox.Load{Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one client, %s: %s", dst, r)
		if len(r.Counts) != 1 || r.Failed() > 0 {
			t.Errorf("one client reached %v (failed %d), want one backend", r.Counts, r.Failed())
		}
		for k := range r.Counts {
			seen = append(seen, k)
		}
	}
	if len(seen) == 2 && seen[0] != seen[1] {
		t.Errorf("the clusterIP and the node port sent one client to %v", seen)
	}
	refusedConn(t, f.client, "no endpoints, clusterIP", ap("198.18.0.66:80"))
	refusedConn(t, f.client, "no endpoints, node port", ap("198.19.254.1:30166"))
	// verify agrees with the desired state on every entry point.
	if out, code := f.verify(); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
	_ = dataplane.EntryNodePort
}
