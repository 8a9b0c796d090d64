//go:build gateway

package gateway

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller/gateway"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// TestStatusLeaderFailover: two agents (two nodes, one sandbox each) both
// program a route, one holds the Lease and writes status; when it stops,
// the other takes the Lease and writes the status of the next change.
func TestStatusLeaderFailover(t *testing.T) {
	e := newEnv(t)
	a, b := backend{"a", "198.19.5.2"}, backend{"b", "198.19.5.3"}
	e.addPods(a, b)
	e.service(testNS, "s1", "198.18.0.50", nil, a)
	e.service(testNS, "s2", "198.18.0.51", nil, b)
	e.startAgent()

	// The second node: its own sandbox (node, client and pods), the same
	// API server through its own relay.
	sb2 := sandbox.NewT(t, sandbox.Options{})
	u, err := url.Parse(e.cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	stop2, err := sb2.Node.Forward(netip.MustParseAddrPort(u.Host), u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, ag := range sb2.Agents() {
			_ = ag.Stop()
		}
		stop2()
	})
	for _, p := range []backend{a, b} {
		if _, err := sb2.AddPod(p.pod, netip.MustParseAddr(p.ip), podPort); err != nil {
			t.Fatal(err)
		}
	}
	client2, err := sb2.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	agent2, err := sb2.StartAgent(steelyardBin, "run", "--kubeconfig", e.cp.Kubeconfig, "--node-name", "node2",
		"--cluster-cidr", sandbox.ClusterCIDR.String(), "--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr,
		"--log-level", "debug", "--gateway", "--gateway-address-pool", pool, "--gateway-lease-namespace", leaseNS)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]*sandbox.Agent{nodeName: e.agent, "node2": agent2}

	e.newGateway("gw", listener("tcp", gwv1.TCPProtocolType, 80))
	e.tcpRoute(testNS, "web", []gwv1.ParentReference{gatewayParent("gw", "")}, ref("", "s1", 1), ref("", "s2", 1))
	addr := e.gatewayAddress("gw")
	waitCondition(t, "TCPRoute web", "Accepted", metav1.ConditionTrue, "Accepted", e.tcpRouteConds(testNS, "web", "gw"))
	want := map[string]float64{a.ip: 50, b.ip: 50}
	e.waitShares(addr.String(), dataplane.TCP, want, 15*time.Second)
	sandbox.Poll(t, 15*time.Second, 50*time.Millisecond, "node2 programming the route", func() (bool, string) {
		out, _, err := sb2.Node.Exec2(steelyardBin, "explain", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, addr.String()), "not yet"
	})
	for name, ns := range map[string]*sandbox.NS{nodeName: e.client, "node2": client2} {
		r, err := ns.TCPConns(netip.AddrPortFrom(addr, 80), 2000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("through %s:", name)
		sandbox.ExpectShares(t, r, map[string]float64{"a": 50, "b": 50}, 4.5) // sigma 1.1 points
	}

	holder := func() string {
		l, err := e.admin.CoordinationV1().Leases(leaseNS).Get(t.Context(), gateway.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	var first string
	sandbox.Poll(t, 20*time.Second, 100*time.Millisecond, "a Lease holder", func() (bool, string) {
		first = holder()
		return first != "", "none"
	})
	t.Logf("Lease %s/%s held by %s", leaseNS, gateway.LeaseName, first)
	for name, ag := range agents {
		leads := strings.Contains(ag.Log(), "writing Gateway API status (leader)")
		if leads != (name == first) {
			t.Errorf("%s: log says leader=%v, Lease holder is %s", name, leads, first)
		}
	}

	// Stop the leader (it releases the Lease), then change the route.
	start := time.Now()
	if err := agents[first].Stop(); err != nil {
		t.Logf("stopping %s: %v", first, err)
	}
	e.setTCPWeights(testNS, "web", 1, 3)
	sandbox.Poll(t, 30*time.Second, 50*time.Millisecond, "the other agent writing status of generation 2", func() (bool, string) {
		cs, err := e.tcpRouteConds(testNS, "web", "gw")()
		if err != nil || len(cs) == 0 {
			return false, "no status"
		}
		return cs[0].ObservedGeneration == 2, fmt.Sprintf("observedGeneration still %d", cs[0].ObservedGeneration)
	})
	second := holder()
	t.Logf("leader %s stopped -> %s holds the Lease and wrote generation 2's status after %v", first, second, time.Since(start).Round(time.Millisecond))
	if second == first || second == "" {
		t.Errorf("Lease holder after the stop: %q", second)
	}
	// The surviving node programs the new weights.
	survivor := sb2
	if second == nodeName {
		survivor = e.sb
	}
	sandbox.Poll(t, 10*time.Second, 50*time.Millisecond, "the survivor programming 25/75", func() (bool, string) {
		out, _, err := survivor.Node.Exec2(steelyardBin, "explain", "-o", "json")
		if err != nil {
			return false, err.Error()
		}
		views := decodeViews(t, out)
		got := viewcheck.Shares(findView(views, addr.String(), 80, dataplane.TCP))
		return viewcheck.Same(got, map[string]float64{a.ip: 25, b.ip: 75}), "shows " + formatMap(got)
	})
}
