package iptables

// Test IP plan (198.18.0.0/15 only, the benchmarking range):
//   VIPs:          198.18.0.10 .. 198.18.0.20 (Services)
//   pods:          198.19.1.2 .. 198.19.1.9 (cluster CIDR 198.19.0.0/17)
//   outside client 198.19.254.2 (outside the cluster CIDR)

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

var testCfg = Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}}

func svcPort(ns, name, port, vip string, vport uint16, proto dataplane.Protocol, backends ...dataplane.Backend) dataplane.ServicePort {
	return dataplane.ServicePort{
		Name:     dataplane.ServicePortName{Namespace: ns, Name: name, Port: port},
		VIP:      dataplane.VIP{IP: netip.MustParseAddr(vip), Port: vport, Protocol: proto},
		Backends: backends,
	}
}

func be(ip string, port uint16, w float64) dataplane.Backend {
	return dataplane.Backend{IP: netip.MustParseAddr(ip), Port: port, Weight: w, Ready: true, Serving: true}
}

func TestProbabilitiesRebuildShares(t *testing.T) {
	cases := [][]float64{
		{10, 90},
		{1, 2, 3, 4},
		{1, 65535},
		{65535, 1, 65535, 1},
		{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 7},
		{0.9, 89.1, 10},
		{5},
	}
	for _, ws := range cases {
		t.Run(fmt.Sprint(ws), func(t *testing.T) {
			probs := Probabilities(ws)
			if probs[len(probs)-1] != 1 {
				t.Fatalf("last probability %v, want 1", probs[len(probs)-1])
			}
			// Rebuild shares from the probabilities as printed in the rules.
			printed := make([]float64, len(probs))
			for i, p := range probs {
				if _, err := fmt.Sscan(FormatProbability(p), &printed[i]); err != nil {
					t.Fatal(err)
				}
			}
			var total float64
			for _, w := range ws {
				total += w
			}
			for i, s := range Shares(printed) {
				if want := ws[i] / total; math.Abs(s-want) > 1e-6 {
					t.Errorf("endpoint %d: share %.9f, want %.9f", i, s, want)
				}
			}
		})
	}
}

func TestRenderTenNinety(t *testing.T) {
	s := dataplane.State{Services: []dataplane.ServicePort{
		svcPort("demo", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90)),
		svcPort("demo", "empty", "dns", "198.18.0.11", 53, dataplane.UDP),
	}}
	r := Render(s, testCfg)
	svc := ServiceChain(s.Services[0].Name, dataplane.TCP)
	sep1 := EndpointChain(s.Services[0].Name, dataplane.TCP, s.Services[0].Backends[0])
	sep2 := EndpointChain(s.Services[0].Name, dataplane.TCP, s.Services[0].Backends[1])
	want := strings.NewReplacer("SVC", string(svc), "SEP1", string(sep1), "SEP2", string(sep2)).Replace(`*filter
:STEELYARD-SERVICES - [0:0]
:STEELYARD-NODEPORTS - [0:0]
:STEELYARD-FORWARD - [0:0]
:STEELYARD-FIREWALL - [0:0]
-A STEELYARD-SERVICES -d 198.18.0.11/32 -p udp -m comment --comment "demo/empty:dns has no endpoints" -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable
-A STEELYARD-FORWARD -m comment --comment "steelyard: drop invalid conntrack state (kubernetes#74839)" -m conntrack --ctstate INVALID -j DROP
-A STEELYARD-FORWARD -m comment --comment "steelyard: forward masqueraded service traffic" -m mark --mark 0x2000/0x2000 -m conntrack --ctstate DNAT -j ACCEPT
-A STEELYARD-FORWARD -m comment --comment "steelyard: forward replies of service traffic" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
*nat
:STEELYARD-SERVICES - [0:0]
:STEELYARD-NODEPORTS - [0:0]
:STEELYARD-MARK-MASQ - [0:0]
:STEELYARD-POSTROUTING - [0:0]
:SVC - [0:0]
:SEP1 - [0:0]
:SEP2 - [0:0]
-A STEELYARD-SERVICES -d 198.18.0.10/32 -p tcp -m comment --comment "demo/web:http" -m tcp --dport 80 -j SVC
-A STEELYARD-MARK-MASQ -j MARK --set-xmark 0x2000/0x2000
-A STEELYARD-POSTROUTING -m mark ! --mark 0x2000/0x2000 -j RETURN
-A STEELYARD-POSTROUTING -j MARK --set-xmark 0x2000/0x0
-A STEELYARD-POSTROUTING -m comment --comment "steelyard: masquerade hairpin and off-cluster traffic" -j MASQUERADE --random-fully
-A SVC ! -s 198.19.0.0/17 -d 198.18.0.10/32 -p tcp -m comment --comment "demo/web:http off-cluster" -m tcp --dport 80 -j STEELYARD-MARK-MASQ
-A SVC -m comment --comment "demo/web:http -> 198.19.1.2:8080 weight 10" -m statistic --mode random --probability 0.1000000000 -j SEP1
-A SVC -m comment --comment "demo/web:http -> 198.19.1.3:8080 weight 90" -j SEP2
-A SEP1 -s 198.19.1.2/32 -m comment --comment "demo/web:http hairpin" -j STEELYARD-MARK-MASQ
-A SEP1 -p tcp -m comment --comment "demo/web:http" -m tcp -j DNAT --to-destination 198.19.1.2:8080
-A SEP2 -s 198.19.1.3/32 -m comment --comment "demo/web:http hairpin" -j STEELYARD-MARK-MASQ
-A SEP2 -p tcp -m comment --comment "demo/web:http" -m tcp -j DNAT --to-destination 198.19.1.3:8080
COMMIT
`)
	if got := string(FullRestore(r)); got != want {
		t.Errorf("rendered rules differ.\ngot:\n%s\nwant:\n%s", got, want)
	}
	if len(svc) > 28 || len(sep1) > 28 {
		t.Errorf("chain names longer than iptables allows: %s %s", svc, sep1)
	}
}

// syncAndView programs s into a fresh fake kernel and reads it back the way
// explain does.
func syncAndView(t *testing.T, s dataplane.State) (*Fake, map[string]dataplane.ServiceView) {
	t.Helper()
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return f, viewsByService(t, f)
}

func viewsByService(t *testing.T, f *Fake) map[string]dataplane.ServiceView {
	t.Helper()
	views, err := Views(f.Ruleset())
	if err != nil {
		t.Fatalf("views: %v", err)
	}
	out := map[string]dataplane.ServiceView{}
	for _, v := range views {
		out[v.Service] = v
	}
	return out
}

func shares(v dataplane.ServiceView) map[string]float64 {
	out := map[string]float64{}
	for _, b := range v.Backends {
		out[fmt.Sprintf("%s:%d", b.IP, b.Port)] = b.Share
	}
	return out
}

func TestTracerShares(t *testing.T) {
	cases := []struct {
		name     string
		backends []dataplane.Backend
		want     map[string]float64 // percent
		reject   bool
	}{
		{"10/90", []dataplane.Backend{be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90)},
			map[string]float64{"198.19.1.2:80": 10, "198.19.1.3:80": 90}, false},
		{"1:2:3:4", []dataplane.Backend{be("198.19.1.2", 80, 1), be("198.19.1.3", 80, 2), be("198.19.1.4", 80, 3), be("198.19.1.5", 80, 4)},
			map[string]float64{"198.19.1.2:80": 10, "198.19.1.3:80": 20, "198.19.1.4:80": 30, "198.19.1.5:80": 40}, false},
		{"zero weight gets nothing", []dataplane.Backend{be("198.19.1.2", 80, 0), be("198.19.1.3", 80, 1), be("198.19.1.4", 80, 1)},
			map[string]float64{"198.19.1.3:80": 50, "198.19.1.4:80": 50}, false},
		{"one endpoint", []dataplane.Backend{be("198.19.1.2", 80, 7)},
			map[string]float64{"198.19.1.2:80": 100}, false},
		{"1 and 65535", []dataplane.Backend{be("198.19.1.2", 80, 1), be("198.19.1.3", 80, 65535)},
			map[string]float64{"198.19.1.2:80": 100.0 / 65536, "198.19.1.3:80": 100 * 65535.0 / 65536}, false},
		// A split 90/10 across two Services of 2 and 1 endpoints.
		{"split across Services", []dataplane.Backend{be("198.19.1.2", 80, 45), be("198.19.1.3", 80, 45), be("198.19.1.4", 80, 10)},
			map[string]float64{"198.19.1.2:80": 45, "198.19.1.3:80": 45, "198.19.1.4:80": 10}, false},
		{"none rejects", nil, map[string]float64{}, true},
		{"all weights zero rejects", []dataplane.Backend{be("198.19.1.2", 80, 0)}, map[string]float64{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := dataplane.State{Services: []dataplane.ServicePort{svcPort("ns", "svc", "http", "198.18.0.10", 80, dataplane.TCP, tc.backends...)}}
			_, views := syncAndView(t, s)
			v, ok := views["ns/svc:http"]
			if !ok {
				t.Fatalf("VIP not found in %v", views)
			}
			if v.Reject != tc.reject {
				t.Errorf("reject = %v, want %v", v.Reject, tc.reject)
			}
			got := shares(v)
			if len(got) != len(tc.want) {
				t.Fatalf("shares %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if math.Abs(got[k]-w) > 1e-6*100 {
					t.Errorf("%s: share %.7f%%, want %.7f%%", k, got[k], w)
				}
			}
			if diff := dataplane.Diff(dataplane.Expected(s), []dataplane.ServiceView{v}); len(diff) > 0 {
				t.Errorf("expected and traced views differ:\n%s", strings.Join(diff, "\n"))
			}
		})
	}
}

func TestMasqueradeDecisions(t *testing.T) {
	s := dataplane.State{Services: []dataplane.ServicePort{
		svcPort("ns", "one", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1)),
	}}
	f, _ := syncAndView(t, s)
	rs := f.Ruleset()
	mark := uint32(1) << DefaultMasqueradeBit
	cases := []struct {
		name string
		src  string
		masq bool
	}{
		{"hairpin: the pod itself", "198.19.1.2", true},
		{"another pod", "198.19.1.3", false},
		{"off-cluster client", "198.19.254.2", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := rs.Trace(TableNAT, "PREROUTING", Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr("198.18.0.10"), Protocol: "tcp", DPort: 80})
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != 1 || out[0].Verdict != "DNAT" || out[0].DNAT.String() != "198.19.1.2:8080" {
				t.Fatalf("outcomes %+v, want one DNAT to 198.19.1.2:8080", out)
			}
			if got := out[0].Mark&mark != 0; got != tc.masq {
				t.Errorf("masquerade = %v, want %v", got, tc.masq)
			}
			// POSTROUTING masquerades exactly the marked packets.
			post, err := rs.Trace(TableNAT, "POSTROUTING", Packet{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr("198.19.1.2"), Protocol: "tcp", DPort: 8080, Mark: out[0].Mark})
			if err != nil {
				t.Fatal(err)
			}
			if len(post) != 1 || post[0].Mark&mark != 0 {
				t.Errorf("postrouting outcome %+v: the masquerade bit must be cleared", post)
			}
		})
	}
	// A port that is not the Service's is not touched.
	out, err := rs.Trace(TableNAT, "PREROUTING", Packet{Src: netip.MustParseAddr("198.19.1.3"), Dst: netip.MustParseAddr("198.18.0.10"), Protocol: "tcp", DPort: 81})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Verdict != "ACCEPT" {
		t.Errorf("port 81: %+v, want untouched", out)
	}
}

func TestPartialSyncWritesOnlyChangedChains(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	api := svcPort("ns", "api", "http", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4", 80, 1))
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web, api}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if !p.LastSync.Full {
		t.Fatal("first sync must be full")
	}

	// Nothing changed: nothing is written.
	restores := f.Restores
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web, api}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if f.Restores != restores {
		t.Errorf("a no-op sync ran iptables-restore")
	}

	// One weight changes: only web's Service chain is written.
	web2 := web
	web2.Backends = []dataplane.Backend{be("198.19.1.2", 80, 50), be("198.19.1.3", 80, 50)}
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web2, api}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if p.LastSync.Full || p.LastSync.ChainsWritten != 1 || p.LastSync.ChainsDeleted != 0 {
		t.Errorf("partial sync stats %+v, want one chain written", p.LastSync)
	}
	if !strings.Contains(string(f.LastRestore), string(ServiceChain(web.Name, dataplane.TCP))) ||
		strings.Contains(string(f.LastRestore), string(ServiceChain(api.Name, dataplane.TCP))) {
		t.Errorf("restore touched the wrong chains:\n%s", f.LastRestore)
	}
	if got := shares(viewsByService(t, f)["ns/web:http"]); math.Abs(got["198.19.1.2:80"]-50) > 1e-6 {
		t.Errorf("after the change: %v", got)
	}

	// api goes away: its chains are deleted, STEELYARD-SERVICES rewritten,
	// and the fake's referential checks passed.
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web2}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if p.LastSync.ChainsDeleted != 2 {
		t.Errorf("stats %+v, want api's two chains deleted", p.LastSync)
	}
	for _, c := range f.Ruleset().SteelyardChains(TableNAT) {
		if c == ServiceChain(api.Name, dataplane.TCP) {
			t.Errorf("api's chain %s is still there", c)
		}
	}
}

func TestFailedSyncKeepsPreviousRulesAndForcesFull(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	before := f.Ruleset().String()
	f.RestoreErr = errors.New("iptables-restore: line 7 failed")
	web2 := web
	web2.Backends = []dataplane.Backend{be("198.19.1.2", 80, 1)}
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web2}}, dataplane.PartialSync); err == nil {
		t.Fatal("sync succeeded despite the restore failure")
	}
	if after := f.Ruleset().String(); after != before {
		t.Errorf("a failed sync changed the kernel")
	}
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web2}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if !p.LastSync.Full {
		t.Errorf("the sync after a failure must be full")
	}
}

func TestFullSyncRepairsHandEditsAndRemovesStrayChains(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	state := dataplane.State{Services: []dataplane.ServicePort{web}}
	f := NewFake()
	// A chain left by an earlier run (a Service deleted while we were away).
	if err := f.Restore([]byte("*nat\n:STEELYARD-SVC-LEFTOVER00000 - [0:0]\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(state, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if f.Ruleset().Chain(TableNAT, "STEELYARD-SVC-LEFTOVER00000") != nil {
		t.Error("the leftover chain survived the first (full) sync")
	}
	// An operator deletes the first endpoint rule by hand.
	if err := f.DeleteRuleAt(TableNAT, ServiceChain(web.Name, dataplane.TCP), 2); err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(state), mustViews(t, f)); len(diff) == 0 {
		t.Fatal("verify would pass after a hand edit")
	}
	// A partial sync does not notice (nothing changed in the desired state)...
	if _, err := p.Sync(state, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	// ...the periodic full one repairs it, rewriting only that chain.
	if _, err := p.Sync(state, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if st := p.LastSync; !st.Full || st.ChainsWritten != 1 || st.ChainsDeleted != 0 {
		t.Errorf("repair stats %+v, want one chain written", st)
	}
	// A full sync over an intact kernel writes nothing.
	restores := f.Restores
	if _, err := p.Sync(state, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if f.Restores != restores {
		t.Errorf("a full sync over an intact kernel ran iptables-restore:\n%s", f.LastRestore)
	}
	if diff := dataplane.Diff(dataplane.Expected(state), mustViews(t, f)); len(diff) > 0 {
		t.Errorf("still differs after a full sync:\n%s", strings.Join(diff, "\n"))
	}
}

func mustViews(t *testing.T, f *Fake) []dataplane.ServiceView {
	t.Helper()
	v, err := Views(f.Ruleset())
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestSameRuleToleratesSaveFormatting(t *testing.T) {
	rendered := `-m comment --comment "demo/web:http -> 198.19.1.2:8080 weight 10" -m statistic --mode random --probability 0.1000000000 -j STEELYARD-SEP-X`
	saved := `-m comment --comment "demo/web:http -> 198.19.1.2:8080 weight 10" -m statistic --mode random --probability 0.10000000009 -j STEELYARD-SEP-X`
	if !sameRule(saved, rendered) {
		t.Error("kernel rounding of the probability counted as a difference")
	}
	if !sameRule(`-p tcp -m comment --comment demo/web:http -m tcp -j DNAT --to-destination 198.19.1.2:8080`,
		`-p tcp -m comment --comment "demo/web:http" -m tcp -j DNAT --to-destination 198.19.1.2:8080`) {
		t.Error("quoting counted as a difference")
	}
	if sameRule(strings.Replace(saved, "0.10000000009", "0.2000000000", 1), rendered) {
		t.Error("a different probability counted as equal")
	}
	if sameRule(`-j STEELYARD-SEP-X`, `-j STEELYARD-SEP-Y`) {
		t.Error("a different target counted as equal")
	}
}

func TestMissingJumpShowsInExplain(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 1))
	f, _ := syncAndView(t, dataplane.State{Services: []dataplane.ServicePort{web}})
	if err := f.DeleteRule(TableNAT, "PREROUTING", jumps[0].args...); err != nil {
		t.Fatal(err)
	}
	v := viewsByService(t, f)["ns/web:http"]
	if len(v.Backends) != 0 || v.Reject {
		t.Errorf("with PREROUTING's jump gone, explain must show the VIP as not forwarded; got %+v", v)
	}
	if !strings.Contains(v.Line(), "not forwarded") {
		t.Errorf("line %q", v.Line())
	}
}

func TestCleanupRemovesOnlySteelyard(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 1))
	f := NewFake()
	if err := f.AddRule(TableNAT, "PREROUTING", "-d", "198.18.1.1/32", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	if err := f.Restore([]byte("*filter\n:OTHER-CHAIN - [0:0]\n-A OTHER-CHAIN -j ACCEPT\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if err := p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	saved := f.Ruleset().String()
	if strings.Contains(saved, "STEELYARD") || strings.Contains(saved, "steelyard") {
		t.Errorf("steelyard rules left after cleanup:\n%s", saved)
	}
	for _, keep := range []string{"-A PREROUTING -d 198.18.1.1/32 -j ACCEPT", "-A OTHER-CHAIN -j ACCEPT"} {
		if !strings.Contains(saved, keep) {
			t.Errorf("cleanup removed a foreign rule %q:\n%s", keep, saved)
		}
	}
	// Cleanup twice is fine.
	if err := p.Cleanup(); err != nil {
		t.Fatal(err)
	}
}

func TestParseRealIptablesSave(t *testing.T) {
	// What iptables-nft-save prints for a rendered Service (probabilities in
	// 11 decimals from the kernel's 31-bit fixed point).
	saved := `# Generated by iptables-nft-save v1.8.9 (nf_tables) on Mon Nov 30 10:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:STEELYARD-SERVICES - [0:0]
:STEELYARD-SVC-AAAAAAAAAAAAAA - [0:0]
:STEELYARD-SEP-BBBBBBBBBBBBBB - [0:0]
:STEELYARD-SEP-CCCCCCCCCCCCCC - [0:0]
-A PREROUTING -m comment --comment "steelyard service portals" -j STEELYARD-SERVICES
-A STEELYARD-SERVICES -d 198.18.0.10/32 -p tcp -m comment --comment demo/web:http -m tcp --dport 80 -j STEELYARD-SVC-AAAAAAAAAAAAAA
-A STEELYARD-SVC-AAAAAAAAAAAAAA -m comment --comment "demo/web:http -> 198.19.1.2:8080 weight 10" -m statistic --mode random --probability 0.10000000009 -j STEELYARD-SEP-BBBBBBBBBBBBBB
-A STEELYARD-SVC-AAAAAAAAAAAAAA -m comment --comment "demo/web:http -> 198.19.1.3:8080 weight 90" -j STEELYARD-SEP-CCCCCCCCCCCCCC
-A STEELYARD-SEP-BBBBBBBBBBBBBB -p tcp -m comment --comment demo/web:http -m tcp -j DNAT --to-destination 198.19.1.2:8080
-A STEELYARD-SEP-CCCCCCCCCCCCCC -p tcp -m comment --comment demo/web:http -m tcp -j DNAT --to-destination 198.19.1.3:8080
COMMIT
`
	rs, err := ParseRuleset([]byte(saved))
	if err != nil {
		t.Fatal(err)
	}
	views, err := Views(rs)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 {
		t.Fatalf("views %+v", views)
	}
	want := "198.18.0.10:80/TCP  198.19.1.2:8080 10.00%  198.19.1.3:8080 90.00%  demo/web:http"
	if got := views[0].Line(); got != want {
		t.Errorf("line\n got %q\nwant %q", got, want)
	}
}

func TestExplainReportsBrokenHairpin(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 1), be("198.19.1.3", 80, 1))
	state := dataplane.State{Services: []dataplane.ServicePort{web}}
	for name, breakIt := range map[string]func(f *Fake) error{
		"hairpin rule deleted": func(f *Fake) error {
			return f.DeleteRuleAt(TableNAT, EndpointChain(web.Name, dataplane.TCP, web.Backends[0]), 1)
		},
		"postrouting flushed": func(f *Fake) error {
			return f.Restore([]byte("*nat\n:STEELYARD-POSTROUTING - [0:0]\nCOMMIT\n"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			f, views := syncAndView(t, state)
			if p := views["ns/web:http"].Problems; len(p) != 0 {
				t.Fatalf("problems on intact rules: %v", p)
			}
			if err := breakIt(f); err != nil {
				t.Fatal(err)
			}
			live := mustViews(t, f)
			if len(live) != 1 || len(live[0].Problems) == 0 {
				t.Fatalf("no problem reported: %+v", live)
			}
			if diff := dataplane.Diff(dataplane.Expected(state), live); len(diff) == 0 {
				t.Error("verify would pass")
			}
		})
	}
}

func TestPartialSyncRemovesAnEndpointsChain(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 1), be("198.19.1.3", 80, 1))
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	gone := EndpointChain(web.Name, dataplane.TCP, web.Backends[1])
	web2 := web
	web2.Backends = web.Backends[:1]
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web2}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if st := p.LastSync; st.Full || st.ChainsWritten != 1 || st.ChainsDeleted != 1 {
		t.Errorf("stats %+v, want the Service chain written and one endpoint chain deleted", st)
	}
	if f.Ruleset().Chain(TableNAT, gone) != nil {
		t.Errorf("chain %s of the removed endpoint is still there", gone)
	}
	// And back: the chain returns.
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if f.Ruleset().Chain(TableNAT, gone) == nil {
		t.Errorf("chain %s did not come back", gone)
	}
	if diff := dataplane.Diff(dataplane.Expected(dataplane.State{Services: []dataplane.ServicePort{web}}), mustViews(t, f)); len(diff) > 0 {
		t.Errorf("kernel differs:\n%s", strings.Join(diff, "\n"))
	}
}

// A share that falls on a rounding boundary (87/39/2 -> 67.96875%) must
// not make verify report a mismatch whose two lines print the same.
func TestVerifyAgreesOnRoundingBoundaries(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 87), be("198.19.1.3", 80, 39), be("198.19.1.4", 80, 2))
	state := dataplane.State{Services: []dataplane.ServicePort{web}}
	f, _ := syncAndView(t, state)
	// What iptables-save prints: the kernel keeps round(p * 2^31).
	kernel := regexp.MustCompile(`--probability ([0-9.]+)`).ReplaceAllStringFunc(f.Ruleset().String(), func(m string) string {
		p, err := strconv.ParseFloat(strings.Fields(m)[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("--probability %.11f", math.Round(p*(1<<31))/(1<<31))
	})
	rs, err := ParseRuleset([]byte(kernel))
	if err != nil {
		t.Fatal(err)
	}
	live, err := Views(rs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(state), live); len(diff) > 0 {
		t.Errorf("verify disagrees with itself:\n%s", strings.Join(diff, "\n"))
	}
}

// A partial Sync trusts the change tracker's set (SyncRequest.Changed): it
// renders again only the ports of the Services named there and reuses the
// others without comparing them; a full Sync compares everything.
func TestPartialSyncRendersOnlyTheChangedServices(t *testing.T) {
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 80, 10), be("198.19.1.3", 80, 90))
	api := svcPort("ns", "api", "http", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4", 80, 1), be("198.19.1.5", 80, 1))
	f := NewFake()
	p := NewProxier(f, testCfg)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web, api}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	web2, api2 := web, api
	web2.Backends = []dataplane.Backend{be("198.19.1.2", 80, 50), be("198.19.1.3", 80, 50)}
	api2.Backends = []dataplane.Backend{be("198.19.1.4", 80, 3), be("198.19.1.5", 80, 1)}
	s := dataplane.State{Services: []dataplane.ServicePort{web2, api2}}
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{{Namespace: "ns", Name: "web"}: true}}
	res, err := p.Sync(s, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Full || p.LastSync.ChainsWritten != 1 {
		t.Errorf("result %+v, stats %+v; want partial, web's chain only", res, p.LastSync)
	}
	views := viewsByService(t, f)
	if got := shares(views["ns/web:http"]); math.Abs(got["198.19.1.2:80"]-50) > 1e-6 {
		t.Errorf("web: %v, want 50/50", got)
	}
	if got := shares(views["ns/api:http"]); math.Abs(got["198.19.1.4:80"]-50) > 1e-6 {
		t.Errorf("api (not in the changed set) was looked at: %v", got)
	}
	res, err = p.Sync(s, dataplane.FullSync)
	if err != nil || !res.Full {
		t.Fatalf("full sync: %+v %v", res, err)
	}
	if got := shares(viewsByService(t, f)["ns/api:http"]); math.Abs(got["198.19.1.4:80"]-75) > 1e-6 {
		t.Errorf("api after the full sync: %v, want 75/25", got)
	}
}

// A Gateway route's Service port name can exceed the comment match's 255
// bytes, which iptables truncates without an error: explain then lost the
// name and its entry suffix. Comments carry dataplane.ShortName of it.
func TestLongNamesFitComments(t *testing.T) {
	long := svcPort("gateway-conformance-infra", "udp-multi-listener-gateway",
		"by-section-and-port/UDPRoute/gateway-conformance-infra/"+strings.Repeat("udp-echo-by-section-and-port-", 8), "198.18.0.30", 5302, dataplane.UDP,
		be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3))
	long.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.200.3")}
	if len(long.Name.String()) <= dataplane.XtCommentMax {
		t.Fatalf("fixture name fits already (%d bytes)", len(long.Name.String()))
	}
	s := dataplane.State{Services: []dataplane.ServicePort{long}}
	f, _ := syncAndView(t, s)
	for _, tc := range f.Ruleset().Tables {
		for _, c := range tc.Chains {
			for _, r := range c.Rules {
				if len(r.Comment) >= 255 {
					t.Errorf("%s: comment of %d bytes: %q", c.Name, len(r.Comment), r.Comment)
				}
			}
		}
	}
	live := mustViews(t, f)
	if len(live) != 2 {
		t.Errorf("explain shows %d entry points, want 2 (clusterIP, external IP)", len(live))
	}
	if diff := dataplane.Diff(dataplane.Expected(s), live); len(diff) > 0 {
		t.Errorf("verify disagrees:\n%s", strings.Join(diff, "\n"))
	}
}
