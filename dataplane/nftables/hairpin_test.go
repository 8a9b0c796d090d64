package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// hairpinElems lists the hairpin set's elements as "addr . proto . port . addr".
func hairpinElems(t *testing.T, nft knftables.Interface) []string {
	t.Helper()
	es, err := nft.ListElements(t.Context(), "set", setHairpin)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, strings.Join(splitKey(e.Key), " . "))
	}
	slices.Sort(out)
	return out
}

func wantHairpin(t *testing.T, what string, nft knftables.Interface, want ...string) {
	t.Helper()
	var w []string
	for _, a := range want {
		w = append(w, a+" . tcp . 8080 . "+a)
	}
	slices.Sort(w)
	if got := hairpinElems(t, nft); !slices.Equal(got, w) {
		t.Errorf("%s: hairpin set %q, want %q", what, got, w)
	}
}

// TestHairpinSetCountsSharedEndpoints: two Service ports over the same pod
// need one element; it goes only when the last port that needs it does,
// in partial syncs and after a restart (the counts come from the applied
// state, a full sync recounts them).
func TestHairpinSetCountsSharedEndpoints(t *testing.T) {
	p, nft := newTest(t, 4)
	a := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 1))
	b := svcPort("b", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
	sync := func(what string, req dataplane.SyncRequest, ports ...dataplane.ServicePort) {
		t.Helper()
		if _, err := p.Sync(dataplane.State{Services: ports}, req); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		wantServed(t, what, p, dataplane.State{Services: ports})
	}
	sync("first", dataplane.FullSync, a, b)
	wantHairpin(t, "a and b", nft, "198.19.1.2", "198.19.1.3")

	sync("a goes", dataplane.PartialSync, b)
	wantHairpin(t, "b alone", nft, "198.19.1.2")

	// a comes back while b goes, in one sync: the shared element is
	// neither deleted nor added.
	var ops string
	p.nft = &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) { ops = tx.String() }}
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	p.nft = nft
	if strings.Contains(ops, "198.19.1.2 . tcp . 8080 . 198.19.1.2") {
		t.Errorf("an element kept by the hand-over was written:\n%s", ops)
	}
	wantHairpin(t, "a alone", nft, "198.19.1.2", "198.19.1.3")

	// A restart with a foreign element in the set: the full sync counts
	// every port again and deletes what none needs.
	tx := nft.NewTransaction()
	tx.Add(&knftables.Element{Set: setHairpin, Key: []string{"198.19.9.9", "tcp", "8080", "198.19.9.9"}})
	if err := nft.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	p = NewProxier(nft, p.cfg)
	sync("restart", dataplane.FullSync, a, b)
	wantHairpin(t, "after the restart", nft, "198.19.1.2", "198.19.1.3")
	a2 := a
	a2.Backends = a.Backends[1:]
	sync("a loses the shared pod", dataplane.PartialSync, a2, b)
	wantHairpin(t, "b still has it", nft, "198.19.1.2", "198.19.1.3")
	sync("b goes", dataplane.PartialSync, a2)
	wantHairpin(t, "a2 alone", nft, "198.19.1.3")
	sync("no endpoints", dataplane.PartialSync, svcPort("a", "198.18.0.10", 80, dataplane.TCP))
	wantHairpin(t, "none", nft)
}

// TestAffinityKeepsEndpointChains: a port with ClientIP affinity keeps
// its endpoint chains (hairpin mark, affinity set, DNAT) and verdict map,
// and needs nothing in the hairpin set; a port without has no endpoint
// chain and DNATs through its map.
func TestAffinityKeepsEndpointChains(t *testing.T) {
	p, nft := newTest(t, 4)
	af := svcPort("af", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3))
	af.AffinitySeconds = 600
	plain := svcPort("plain", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 3))
	plain.RejectWeight = 4
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{af, plain}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	wantHairpin(t, "affinity needs none", nft, "198.19.1.4", "198.19.1.5")
	o := p.renderPort(p.eng.Applied(af.Name))
	eps := 0
	for c, rules := range o.chains {
		if strings.HasPrefix(c, epPrefix) {
			eps++
			if t0 := rules[0].text(p.f); !strings.Contains(t0, "saddr 198.19.1.") || !strings.Contains(t0, "jump "+chainMarkMasq) {
				t.Errorf("endpoint chain %s: %q", c, rules)
			}
		}
	}
	if eps != 2 {
		t.Errorf("affinity port: %d endpoint chains, want 2", eps)
	}
	for m, wm := range o.maps {
		if !strings.HasPrefix(m, sharedVerdictPrefix) || wm.data(p.f) != "verdict" {
			t.Errorf("affinity port: map %s of %s", m, wm.data(p.f))
		}
	}
	o = p.renderPort(p.eng.Applied(plain.Name))
	// The split draws at its offset in a shared DNAT map.
	var off uint32
	for c, rules := range o.chains {
		if strings.HasPrefix(c, epPrefix) {
			t.Errorf("port without affinity has endpoint chain %s", c)
		}
		if !strings.HasPrefix(c, svcPrefix) {
			continue
		}
		s, ok := rules[len(rules)-1][1].(numgenDNAT)
		off = s.off
		if !ok || s.mod != Buckets || off%Buckets != 0 || !sharedMap(s.m) || strings.HasPrefix(s.m, sharedVerdictPrefix) {
			t.Errorf("split chain %s: %q", c, rules)
		}
	}
	// 1:3 and a reject weight of 4: half the range has no element.
	for m, wm := range o.maps {
		want := []wmElem{{lo: off, hi: off + 124999, dnat: netip.MustParseAddrPort("198.19.1.4:8080")}, {lo: off + 125000, hi: off + 499999, dnat: netip.MustParseAddrPort("198.19.1.5:8080")}}
		if !slices.Equal(wm.elems, want) || wm.data(p.f) != "ip daddr . tcp dport" {
			t.Errorf("map %s (%s): %v, want %v", m, wm.data(p.f), wm.elems, want)
		}
	}
	st := dataplane.State{Services: []dataplane.ServicePort{af, plain}}
	wantServed(t, "affinity and reject share", p, st)
	for _, v := range tracedViews(t, newTracer(t, nft), st) {
		if v.Service == "default/plain:http" && v.RejectShare != 50 {
			t.Errorf("reject share %v, want 50: %s", v.RejectShare, v.Line())
		}
	}
}
