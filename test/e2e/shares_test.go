//go:build e2e

package e2e

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// How many connections, and why. The number of connections a backend with
// share p receives out of N is binomial, so its observed share has a
// standard deviation of sigma = sqrt(p(1-p)/N):
//
//	10/90,   N = 20,000: sigma(10%) = 0.21 points; 1 point = 4.7 sigma
//	1:2:3:4, N = 40,000: sigma(40%) = 0.245, sigma(30%) = 0.23,
//	                     sigma(20%) = 0.20, sigma(10%) = 0.15 points;
//	                     1 point >= 4.1 sigma for every backend
//	UDP 10/90, N = 4,000: sigma(10%) = 0.47 points; 2 points = 4.2 sigma
//
// At 4 sigma a correct dataplane fails a check about once in 16,000 runs,
// while a real error (a probability computed for the wrong position in the
// chain, 1:2:3:4 read as 25% each, ...) moves a share by 5 points or more.
const (
	tcp1090Conns = 20000
	tcp1234Conns = 40000
	udp1090Flows = 4000
)

var (
	webService = svc{
		name: "web", vip: "198.18.0.10", port: 80, targetPort: 8080,
		annotations: map[string]string{"steelyard.io/weights": "web-1=10,web-2=90"},
		endpoints:   []pod{{"web-1", "198.19.1.2"}, {"web-2", "198.19.1.3"}},
	}
	quadService = svc{
		name: "quad", vip: "198.18.0.11", port: 80, targetPort: 8080,
		annotations: map[string]string{"steelyard.io/weights": "quad-1=1,quad-2=2,quad-3=3,quad-4=4"},
		endpoints: []pod{
			{"quad-1", "198.19.2.2"}, {"quad-2", "198.19.2.3"},
			{"quad-3", "198.19.2.4"}, {"quad-4", "198.19.2.5"},
		},
	}
	dnsService = svc{
		name: "dns", vip: "198.18.0.13", proto: corev1.ProtocolUDP, port: 53, targetPort: 5353,
		annotations: map[string]string{"steelyard.io/weights": "dns-1=10,dns-2=90"},
		endpoints:   []pod{{"dns-1", "198.19.4.2"}, {"dns-2", "198.19.4.3"}},
	}
)

func caseTCPShares(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(webService, quadService)
	f.write("services.yaml", webService, quadService)
	f.start()
	checkFlavour(t, f, m)

	views := f.explain()
	if got := viewcheck.Shares(viewcheck.Find(views, "198.18.0.10", 80)); !viewcheck.Same(got, map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90}) {
		t.Errorf("explain web: %v, want 10/90", got)
	}

	r, err := f.client.TCPConns(addrPort(webService.vip, 80), tcp1090Conns, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("10/90: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 1)

	r, err = f.client.TCPConns(addrPort(quadService.vip, 80), tcp1234Conns, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1:2:3:4: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"quad-1": 10, "quad-2": 20, "quad-3": 30, "quad-4": 40}, 1)
}

// checkFlavour checks that the rules are where the mode writes them: in
// the flavour's iptables and not in the other flavour's, or in steelyard's
// nft tables and in no iptables.
func checkFlavour(t *testing.T, f *fixture, m dpMode) {
	t.Helper()
	if m.flavour == "" {
		tables, err := f.sb.Node.Exec("nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(tables, "table ip steelyard") || !strings.Contains(tables, "table ip6 steelyard") {
			t.Errorf("nftables mode: tables %q, want ip and ip6 steelyard", tables)
		}
		for _, flavour := range []string{"nft", "legacy"} {
			if out, err := f.sb.Node.Exec(iptablesCmd(flavour, "iptables-save")); err == nil && strings.Contains(out, "STEELYARD-") {
				t.Errorf("nftables mode: STEELYARD rules in iptables-%s-save", flavour)
			}
		}
		return
	}
	mode := m.flavour
	other := map[string]string{"nft": "legacy", "legacy": "nft"}[mode]
	mine, err := f.sb.Node.Exec(iptablesCmd(mode, "iptables-save"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := f.sb.Node.Exec(iptablesCmd(other, "iptables-save"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mine, "STEELYARD-SERVICES") {
		t.Errorf("--iptables-mode %s: no STEELYARD rules in iptables-%s-save", mode, mode)
	}
	if strings.Contains(theirs, "STEELYARD-") {
		t.Errorf("--iptables-mode %s: STEELYARD rules in iptables-%s-save too", mode, other)
	}
}

func caseWeightZeroGetsNothing(t *testing.T, m dpMode) {
	zero := svc{
		name: "zero", vip: "198.18.0.12", port: 80, targetPort: 8080,
		annotations: map[string]string{"steelyard.io/weights": "zero-1=1,zero-2=0,zero-3=1"},
		endpoints:   []pod{{"zero-1", "198.19.3.2"}, {"zero-2", "198.19.3.3"}, {"zero-3", "198.19.3.4"}},
	}
	f := newFixture(t, m)
	f.addPods(zero)
	f.write("zero.yaml", zero)
	f.start()

	if got := viewcheck.Shares(viewcheck.Find(f.explain(), zero.vip, 80)); got["198.19.3.3"] != 0 {
		t.Errorf("explain gives the weight-0 endpoint %.2f%%", got["198.19.3.3"])
	}
	// 3,000 connections: sigma(50%) = 0.91 points, 4 points = 4.4 sigma.
	r, err := f.client.TCPConns(addrPort(zero.vip, 80), 3000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1/0/1: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"zero-1": 50, "zero-3": 50}, 4)
	if n := f.sb.Pod("zero-2").Accepted(); n != 0 {
		t.Errorf("the weight-0 pod accepted %d connections", n)
	}
}

func caseUDPShares(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(dnsService)
	f.write("dns.yaml", dnsService)
	f.start()

	r, err := f.client.UDPFlows(addrPort(dnsService.vip, 53), udp1090Flows, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("UDP 10/90: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"dns-1": 10, "dns-2": 90}, 2)
}

// TestOtherOrigins checks the split for connections that do not come from
// the client LAN: from the node itself (locally originated, DNAT in OUTPUT)
// and from a pod (in the cluster CIDR, so not masqueraded).
func caseOtherOrigins(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(webService, quadService)
	f.write("services.yaml", webService, quadService)
	f.start()

	// 3,000 connections: sigma(10%) = 0.55 points, 3 points = 5.5 sigma.
	from := map[string]*sandbox.NS{"node": f.sb.Node, "pod quad-1": f.sb.Pod("quad-1").NS}
	for _, origin := range []string{"node", "pod quad-1"} {
		r, err := from[origin].TCPConns(addrPort(webService.vip, 80), 3000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("from the %s: %s", origin, r)
		sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 3)
	}
}
