package iptables

// Test IP plan: web 198.18.0.10:80 -> 198.19.1.2, 198.19.1.3 (weights 10,
// 90); filler 198.18.0.11:80 -> terseEndpoints endpoints in 198.19.8.0 ..
// 198.19.11.255, which take the State over terseEndpoints.

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// filler returns a Service port whose terseEndpoints endpoints take a
// State with any other endpoint over terseEndpoints.
func filler() dataplane.ServicePort {
	sp := svcPort("ns", "filler", "http", "198.18.0.11", 80, dataplane.TCP)
	for i := range terseEndpoints {
		sp.Backends = append(sp.Backends, dataplane.Backend{IP: netip.AddrFrom4([4]byte{198, 19, byte(8 + i/256), byte(i)}), Port: 8080, Weight: 1, Ready: true, Serving: true})
	}
	return sp
}

// perEndpointComments counts the comments of web's per-endpoint rules:
// its Service chain's split and its endpoint chains' rules.
func perEndpointComments(t *testing.T, f *Fake, web dataplane.ServicePort) int {
	t.Helper()
	rs := f.Ruleset()
	n := 0
	for _, r := range rs.Chain(TableNAT, ServiceChain(web.Name, dataplane.TCP)).Rules {
		if strings.HasPrefix(r.Jump, sepPrefix) && r.Comment != "" {
			n++
		}
	}
	for _, b := range web.Backends {
		for _, r := range rs.Chain(TableNAT, EndpointChain(web.Name, dataplane.TCP, b)).Rules {
			if r.Comment != "" {
				n++
			}
		}
	}
	return n
}

// Above terseEndpoints the per-endpoint rules carry no comment, as in
// kube-proxy's large cluster mode, and nothing that reads the rules back
// changes: explain's shares and affinity, the endpoint counts. A partial
// sync that takes the State back under the threshold (or over it again)
// rewrites the chains of Services that did not change.
func TestTerseRulesAboveTheThreshold(t *testing.T) {
	f := NewFake()
	p := NewProxier(f, testCfg)
	web := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	web.AffinitySeconds = 5
	sync := func(sps ...dataplane.ServicePort) {
		t.Helper()
		if _, err := p.Sync(dataplane.State{Services: sps}, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sps[len(sps)-1].Name.Service(): true}}); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	sync(web)
	// Affinity checks, split, hairpin and DNAT rules of two endpoints.
	if n := perEndpointComments(t, f, web); n != 8 {
		t.Fatalf("under the threshold: %d per-endpoint comments, want 8", n)
	}

	sync(web, filler())
	if n := perEndpointComments(t, f, web); n != 0 {
		t.Errorf("over the threshold: %d per-endpoint comments, want 0", n)
	}
	v := viewsByService(t, f)["ns/web:http"]
	wantShares(t, "explain over the threshold", shares(v), map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90})
	if v.AffinitySeconds != 5 {
		t.Errorf("explain over the threshold: affinity %ds, want 5", v.AffinitySeconds)
	}
	countDNAT(t, f, web, web.Backends[1], 7)
	counts, err := p.Counts()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range counts {
		if c.Endpoint.String() == "198.19.1.3:8080" {
			found = c.Service == "ns/web:http" && c.NewConnections == 7
		}
	}
	if !found {
		t.Errorf("no count of 7 for ns/web:http 198.19.1.3:8080 in %d counts", len(counts))
	}

	// The filler goes: web, unchanged, gets its comments back.
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{web}}, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{{Namespace: "ns", Name: "filler"}: true}}); err != nil {
		t.Fatal(err)
	}
	if n := perEndpointComments(t, f, web); n != 8 {
		t.Errorf("back under the threshold: %d per-endpoint comments, want 8", n)
	}
	sync(web, filler())
	if n := perEndpointComments(t, f, web); n != 0 {
		t.Errorf("over the threshold again: %d per-endpoint comments, want 0", n)
	}
}
