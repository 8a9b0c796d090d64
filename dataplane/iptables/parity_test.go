package iptables

// kube-proxy parity over the fake kernel, checked with the tracer.
//
// Test IP plan (benchmarking ranges only):
//   VIPs:             198.18.0.10 .. 198.18.0.20
//   external IP:      198.18.1.10; load-balancer IP: 198.18.2.10
//   node addresses:   198.19.0.1 (dummy), 198.19.254.1 (client LAN)
//   pods:             198.19.1.2 .. (cluster CIDR 198.19.0.0/17); "local"
//                     ones are marked Local (on this node)
//   clients:          198.19.254.2 (allowed by the source ranges), 198.19.253.2 (not)
//   IPv6:             VIPs 2001:2::a, pods 2001:2:0:1::2.., node 2001:2:0:fe::1

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

var parityCfg = Config{
	Masquerade:        dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17"), netip.MustParsePrefix("2001:2:0:1::/64")}},
	NodePortAddresses: []netip.Addr{netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.254.1"), netip.MustParseAddr("2001:2:0:fe::1")},
}

var masqBit = uint32(1) << DefaultMasqueradeBit

func localBe(ip string, port uint16, w float64) dataplane.Backend {
	b := be(ip, port, w)
	b.Local, b.NodeName = true, "node-a"
	return b
}

// paritySync programs s with parityCfg into a fake kernel and returns the
// ruleset and the views by key.
func paritySync(t *testing.T, s dataplane.State) (*Ruleset, map[string]dataplane.ServiceView) {
	t.Helper()
	f := NewFake()
	p := NewProxier(f, parityCfg)
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatalf("sync: %v", err)
	}
	rs := f.Ruleset()
	views, err := Views(rs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(s), views); len(diff) > 0 {
		t.Errorf("verify: expected and traced views differ:\n%s", strings.Join(diff, "\n"))
	}
	by := map[string]dataplane.ServiceView{}
	for _, v := range views {
		by[v.Key()] = v
		for _, p := range v.Problems {
			t.Errorf("%s: problem %s", v.Key(), p)
		}
	}
	return rs, by
}

// traceFrom traces a new TCP connection and returns the share (percent) per
// DNAT destination, other verdicts by name, and whether every DNATed share
// is masqueraded ("all"), none is ("none") or some are ("mixed").
func traceFrom(t *testing.T, rs *Ruleset, src, dst string, dport int, srcLocal, dstLocal bool) (map[string]float64, string) {
	t.Helper()
	return traceProto(t, rs, "tcp", src, dst, dport, srcLocal, dstLocal)
}

// traceProto is traceFrom for a new connection of protocol proto ("tcp",
// "udp", "sctp").
func traceProto(t *testing.T, rs *Ruleset, proto, src, dst string, dport int, srcLocal, dstLocal bool) (map[string]float64, string) {
	t.Helper()
	start := Chain("PREROUTING")
	if srcLocal {
		start = "OUTPUT"
	}
	p := Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: proto, DPort: dport, SrcLocal: srcLocal, DstLocal: dstLocal}
	outs, err := rs.Trace(TableNAT, start, p)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	masq, plain := false, false
	for _, o := range outs {
		if o.Verdict != "DNAT" {
			got[o.Verdict] += 100 * o.Probability
			continue
		}
		got[o.DNAT.String()] += dataplane.RoundShare(100 * o.Probability)
		if o.Mark&masqBit != 0 {
			masq = true
		} else {
			plain = true
		}
	}
	if len(got) == 1 && got["ACCEPT"] > 0 {
		// Not DNATed: what does the filter table do with it?
		fc := Chain("FORWARD")
		if dstLocal {
			fc = "INPUT"
		}
		if srcLocal {
			fc = "OUTPUT"
		}
		fouts, err := rs.Trace(TableFilter, fc, p)
		if err != nil {
			t.Fatal(err)
		}
		got = map[string]float64{}
		for _, o := range fouts {
			got[o.Verdict] += 100 * o.Probability
		}
	}
	switch {
	case masq && plain:
		return got, "mixed"
	case masq:
		return got, "all"
	}
	return got, "none"
}

func wantShares(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if d := got[k] - w; d > 1e-3 || d < -1e-3 {
			t.Errorf("%s: %v, want %v", what, got, want)
			return
		}
	}
}

func TestNodePortExternalIPsAndLoadBalancer(t *testing.T) {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	sp.NodePort = 30080
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.10")}
	sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.10")}
	sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.254.0/24")}
	rs, views := paritySync(t, dataplane.State{Services: []dataplane.ServicePort{sp}})
	split := map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90}

	traceCases(t, rs, []traceCase{
		{"node port on the LAN address", "198.19.254.2", "198.19.254.1", 30080, false, true, split, "all"},
		{"node port on the dummy address", "198.19.254.2", "198.19.0.1", 30080, false, true, split, "all"},
		{"node port from the node itself", "198.19.254.1", "198.19.254.1", 30080, true, true, split, "all"},
		{"node port from a pod", "198.19.1.9", "198.19.0.1", 30080, false, true, split, "all"},
		{"external IP", "198.19.254.2", "198.18.1.10", 80, false, false, split, "all"},
		{"load-balancer IP, allowed source", "198.19.254.2", "198.18.2.10", 80, false, false, split, "all"},
		{"load-balancer IP, source outside the ranges", "198.19.253.2", "198.18.2.10", 80, false, false, map[string]float64{"DROP": 100}, "none"},
		{"clusterIP from a pod: not masqueraded", "198.19.1.9", "198.18.0.10", 80, false, false, split, "none"},
		{"other port on the node: untouched", "198.19.254.2", "198.19.254.1", 30081, false, true, map[string]float64{"ACCEPT": 100}, "none"},
	})

	np := views["0.0.0.0:30080/TCP"]
	if np.Entry != dataplane.EntryNodePort || np.Policy != dataplane.PolicyCluster || len(np.NodeAddresses) != 2 {
		t.Errorf("node port view %+v", np)
	}
	lb := views["198.18.2.10:80/TCP"]
	if lb.Entry != dataplane.EntryLoadBalancer || strings.Join(lb.SourceRanges, ",") != "198.19.254.0/24" {
		t.Errorf("load-balancer view %+v", lb)
	}
	if line := np.Line(); !strings.Contains(line, "[nodePort, on 198.19.0.1,198.19.254.1, policy Cluster]") {
		t.Errorf("explain line %q", line)
	}
}

func TestExternalTrafficPolicyLocal(t *testing.T) {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP,
		localBe("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 6), localBe("198.19.1.4", 8080, 3))
	sp.NodePort = 30080
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.10")}
	sp.ExternalLocal = true
	sp.HealthCheckNodePort = 30999
	none := svcPort("ns", "remote", "http", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.5", 8080, 1))
	none.NodePort = 30081
	none.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.11")}
	none.ExternalLocal = true
	rs, views := paritySync(t, dataplane.State{Services: []dataplane.ServicePort{sp, none}})

	localOnly := map[string]float64{"198.19.1.2:8080": 25, "198.19.1.4:8080": 75}
	all := map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 60, "198.19.1.4:8080": 30}
	traceCases(t, rs, []traceCase{
		// The client's address is preserved: no masquerade.
		{"node port from off the cluster", "198.19.254.2", "198.19.254.1", 30080, false, true, localOnly, "none"},
		{"external IP from off the cluster", "198.19.254.2", "198.18.1.10", 80, false, false, localOnly, "none"},
		// kube-proxy: pods and the node itself use the cluster-wide set.
		{"node port from a pod", "198.19.1.9", "198.19.254.1", 30080, false, true, all, "none"},
		{"node port from the node", "198.19.254.1", "198.19.254.1", 30080, true, true, all, "all"},
		{"clusterIP is not affected", "198.19.254.2", "198.18.0.10", 80, false, false, all, "all"},
		{"no local endpoint: node port dropped", "198.19.254.2", "198.19.254.1", 30081, false, true, map[string]float64{"DROP": 100}, "none"},
		{"no local endpoint: external IP dropped", "198.19.254.2", "198.18.1.11", 80, false, false, map[string]float64{"DROP": 100}, "none"},
		{"no local endpoint: pods still served", "198.19.1.9", "198.18.1.11", 80, false, false, map[string]float64{"198.19.1.5:8080": 100}, "none"},
	})
	if v := views["0.0.0.0:30080/TCP"]; v.Policy != dataplane.PolicyLocal || v.Drop {
		t.Errorf("node port view %+v", v)
	}
	if v := views["0.0.0.0:30081/TCP"]; v.Policy != dataplane.PolicyLocal || !v.Drop || !strings.Contains(v.Line(), "drop (no local endpoints)") {
		t.Errorf("node port view without local endpoints %+v", v)
	}
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP,
		localBe("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 6), localBe("198.19.1.4", 8080, 3))
	sp.InternalLocal = true
	sp.NodePort = 30080
	none := svcPort("ns", "remote", "http", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.5", 8080, 1))
	none.InternalLocal = true
	rs, views := paritySync(t, dataplane.State{Services: []dataplane.ServicePort{sp, none}})
	got, _ := traceFrom(t, rs, "198.19.1.9", "198.18.0.10", 80, false, false)
	wantShares(t, "clusterIP from a pod", got, map[string]float64{"198.19.1.2:8080": 25, "198.19.1.4:8080": 75})
	got, _ = traceFrom(t, rs, "198.19.254.2", "198.19.254.1", 30080, false, true)
	wantShares(t, "node port (external policy Cluster)", got, map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 60, "198.19.1.4:8080": 30})
	got, _ = traceFrom(t, rs, "198.19.1.9", "198.18.0.11", 80, false, false)
	wantShares(t, "no local endpoint", got, map[string]float64{"DROP": 100})
	if v := views["198.18.0.10:80/TCP"]; v.Policy != dataplane.PolicyLocal || !strings.Contains(v.Line(), "policy Local") {
		t.Errorf("clusterIP view %+v", v)
	}
}

func TestSessionAffinity(t *testing.T) {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	sp.AffinitySeconds = 5
	sp.NodePort = 30080
	rs, views := paritySync(t, dataplane.State{Services: []dataplane.ServicePort{sp}})
	// A new client is in no list: it is split by weight.
	got, _ := traceFrom(t, rs, "198.19.254.2", "198.18.0.10", 80, false, false)
	wantShares(t, "new client", got, map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90})
	for _, key := range []string{"198.18.0.10:80/TCP", "0.0.0.0:30080/TCP"} {
		if v := views[key]; v.AffinitySeconds != 5 || !strings.Contains(v.Line(), "affinity ClientIP 5s") {
			t.Errorf("%s: view %+v", key, v)
		}
	}
	// Each endpoint chain records the client; the Service chain checks
	// the lists first.
	svc := rs.Chain(TableNAT, ServiceChain(sp.Name, dataplane.TCP))
	checks := 0
	for _, r := range svc.Rules {
		if r.Recent != nil && r.Recent.Check && r.Recent.Seconds == 5 && strings.HasPrefix(r.Recent.Name, sepPrefix) && r.Jump == r.Recent.Name {
			checks++
		}
	}
	if checks != 2 {
		t.Errorf("%d affinity checks in the Service chain, want 2", checks)
	}
	for _, b := range sp.Backends {
		sets := 0
		for _, r := range rs.Chain(TableNAT, EndpointChain(sp.Name, dataplane.TCP, b)).Rules {
			if r.Recent != nil && !r.Recent.Check && r.Jump == "DNAT" {
				sets++
			}
		}
		if sets != 1 {
			t.Errorf("%s: %d recent --set before DNAT, want 1", b.IP, sets)
		}
	}
}

func TestTopologyExcludedEndpoints(t *testing.T) {
	out := be("198.19.1.3", 8080, 90)
	out.LocalOnly = true
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), out, be("198.19.1.4", 8080, 30))
	rs, _ := paritySync(t, dataplane.State{Services: []dataplane.ServicePort{sp}})
	got, _ := traceFrom(t, rs, "198.19.1.9", "198.18.0.10", 80, false, false)
	wantShares(t, "in-zone only", got, map[string]float64{"198.19.1.2:8080": 25, "198.19.1.4:8080": 75})
}

func TestIPv6Render(t *testing.T) {
	sp := svcPort("ns", "web6", "http", "2001:2::a", 80, dataplane.TCP, be("2001:2:0:1::2", 8080, 10), be("2001:2:0:1::3", 8080, 90))
	sp.NodePort = 30080
	sp.AffinitySeconds = 60
	none := svcPort("ns", "none6", "http", "2001:2::b", 80, dataplane.TCP)
	cfg := parityCfg
	cfg.Family = 6
	f := NewFake()
	if _, err := NewProxier(f, cfg).Sync(dataplane.State{Services: []dataplane.ServicePort{sp, none}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	text := f.Ruleset().String()
	for _, want := range []string{"icmp6-port-unreachable", "-d 2001:2:0:fe::1/128 -m comment --comment \"steelyard: node ports\"", "! -s 2001:2:0:1::/64", "--mask ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"} {
		if !strings.Contains(text, want) {
			t.Errorf("IPv6 rules lack %q:\n%s", want, text)
		}
	}
	for _, bad := range []string{"198.19.", "icmp-port-unreachable"} {
		if strings.Contains(text, bad) {
			t.Errorf("IPv6 rules contain %q", bad)
		}
	}
	views, err := Views(f.Ruleset())
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(dataplane.State{Services: []dataplane.ServicePort{sp, none}}), views); len(diff) > 0 {
		t.Errorf("verify IPv6:\n%s", strings.Join(diff, "\n"))
	}
	rs := f.Ruleset()
	got, masq := traceFrom(t, rs, "2001:2:0:fd::2", "2001:2:0:fe::1", 30080, false, true)
	wantShares(t, "IPv6 node port", got, map[string]float64{"[2001:2:0:1::2]:8080": 10, "[2001:2:0:1::3]:8080": 90})
	if masq != "all" {
		t.Errorf("IPv6 node port masquerade %s", masq)
	}
}

func TestDualStackOneSyncPerFamily(t *testing.T) {
	v4 := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	v4.NodePort = 30080
	v6 := svcPort("ns", "web", "http", "2001:2::a", 80, dataplane.TCP, be("2001:2:0:1::2", 8080, 10), be("2001:2:0:1::3", 8080, 90))
	v6.NodePort = 30080
	s := dataplane.State{Services: []dataplane.ServicePort{v4, v6}}
	f4, f6 := NewFake(), NewFake()
	d := NewDualStack(f4, f6, parityCfg)
	if _, err := d.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if t4, t6 := f4.Ruleset().String(), f6.Ruleset().String(); strings.Contains(t4, "2001:2:") || strings.Contains(t6, "198.1") {
		t.Errorf("families mixed:\nIPv4:\n%s\nIPv6:\n%s", t4, t6)
	}
	views, err := d.Explain()
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for _, v := range views {
		keys[v.Key()] = true
	}
	for _, k := range []string{"198.18.0.10:80/TCP", "0.0.0.0:30080/TCP", "[2001:2::a]:80/TCP", "[::]:30080/TCP"} {
		if !keys[k] {
			t.Errorf("explain lacks %s: %v", k, keys)
		}
	}
	if diff := dataplane.Diff(dataplane.Expected(s), views); len(diff) > 0 {
		t.Errorf("verify:\n%s", strings.Join(diff, "\n"))
	}
	// A failing IPv6 restore leaves IPv4 applied and is reported.
	f6.RestoreErr = errFake
	v4.Detach() // the records share the synced Backends
	v6.Detach()
	v4.Backends[0].Weight = 30
	v6.Backends[0].Weight = 30
	if _, err := d.Sync(dataplane.State{Services: []dataplane.ServicePort{v4, v6}}, dataplane.FullSync); err == nil || !strings.Contains(err.Error(), "IPv6") {
		t.Errorf("sync error %v, want the IPv6 one", err)
	}
	if !strings.Contains(f4.Ruleset().String(), "weight 30") {
		t.Error("the IPv4 sync did not apply")
	}
	if err := d.Cleanup(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*Fake{f4, f6} {
		if strings.Contains(f.Ruleset().String(), ChainPrefix) {
			t.Errorf("cleanup left chains:\n%s", f.Ruleset())
		}
	}
}

var errFake = fmt.Errorf("fake restore failure")

// A Service port that gains and loses entry points and policies through
// partial syncs leaves no chain behind, and each step reads back as desired.
func TestPartialSyncsAcrossPolicies(t *testing.T) {
	plain := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, localBe("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	rich := plain
	rich.NodePort = 30080
	rich.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.10")}
	rich.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.254.0/24")}
	rich.ExternalLocal, rich.InternalLocal, rich.AffinitySeconds = true, true, 30
	f := NewFake()
	p := NewProxier(f, parityCfg)
	for i, sp := range []dataplane.ServicePort{plain, rich, plain, rich} {
		s := dataplane.State{Services: []dataplane.ServicePort{sp}}
		if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		views, err := Views(f.Ruleset())
		if err != nil {
			t.Fatal(err)
		}
		if diff := dataplane.Diff(dataplane.Expected(s), views); len(diff) > 0 {
			t.Errorf("step %d:\n%s", i, strings.Join(diff, "\n"))
		}
		want := Render(s, parityCfg)
		for _, table := range []Table{TableNAT, TableFilter} {
			for _, c := range f.Ruleset().SteelyardChains(table) {
				if !want.Has(table, c) {
					t.Errorf("step %d: stale chain %s/%s", i, table, c)
				}
			}
		}
	}
}

// verify notices a hand-deleted source-range drop and a hand-deleted local
// chain jump.
func TestVerifyCatchesBrokenParityRules(t *testing.T) {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, localBe("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.10")}
	sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.254.0/24")}
	sp.NodePort = 30080
	sp.ExternalLocal = true
	s := dataplane.State{Services: []dataplane.ServicePort{sp}}
	f := NewFake()
	if _, err := NewProxier(f, parityCfg).Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// The filter rule that drops other sources is the first of the chain.
	if err := f.DeleteRuleAt(TableFilter, ChainServices, 1); err != nil {
		t.Fatal(err)
	}
	// The EXT chain's last rule sends external clients to the local chain.
	ext := ExternalChain(sp.Name, dataplane.TCP)
	if err := f.DeleteRuleAt(TableNAT, ext, len(f.Ruleset().Chain(TableNAT, ext).Rules)); err != nil {
		t.Fatal(err)
	}
	views, err := Views(f.Ruleset())
	if err != nil {
		t.Fatal(err)
	}
	diff := strings.Join(dataplane.Diff(dataplane.Expected(s), views), "\n")
	t.Logf("verify:\n%s", diff)
	for _, want := range []string{"is not dropped", "- 0.0.0.0:30080/TCP"} {
		if !strings.Contains(diff, want) {
			t.Errorf("verify output lacks %q:\n%s", want, diff)
		}
	}
}

// traceCase is one packet traced through a ruleset: from src (srcLocal:
// an address of the node) to dst:port (dstLoc: the node's), with the
// shares it must reach and the masquerade it must get ("all", "none").
type traceCase struct {
	name, src, dst   string
	port             int
	srcLocal, dstLoc bool
	want             map[string]float64
	masq             string
}

// traceCases runs each case as a subtest against rs.
func traceCases(t *testing.T, rs *Ruleset, cases []traceCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			traceCheck(t, rs, "tcp", tc)
		})
	}
}

// traceCheck traces tc with protocol proto and checks shares and masquerade.
func traceCheck(t *testing.T, rs *Ruleset, proto string, tc traceCase) {
	t.Helper()
	got, masq := traceProto(t, rs, proto, tc.src, tc.dst, tc.port, tc.srcLocal, tc.dstLoc)
	wantShares(t, tc.name, got, tc.want)
	if masq != tc.masq {
		t.Errorf("masquerade %s, want %s", masq, tc.masq)
	}
}
