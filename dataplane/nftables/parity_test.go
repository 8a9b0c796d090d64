package nftables

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Test IP plan: VIPs 198.18.0.x, external IPs 198.18.1.x, load-balancer IPs
// 198.18.2.x, node 198.19.200.1, pods 198.19.1.x (cluster CIDR
// 198.19.0.0/17), off-cluster clients 198.19.128.0/24.

func local(b dataplane.Backend) dataplane.Backend { b.Local = true; return b }

func far(b dataplane.Backend) dataplane.Backend { b.LocalOnly = true; return b }

// TestParityEveryEntryPoint renders each row of the README's Service
// features table and checks what explain reads back from the Fake's state
// against dataplane.Expected (computed from the State, not the renderer).
func TestParityEveryEntryPoint(t *testing.T) {
	np := func(sp dataplane.ServicePort) dataplane.ServicePort { sp.NodePort = 30080; return sp }
	cases := map[string]dataplane.ServicePort{
		"clusterIP 10/90": svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90)),
		"nodePort 1:2:3:4": np(svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 2),
			be("198.19.1.4", 8080, 3), be("198.19.1.5", 8080, 4))),
		"externalIP": func() dataplane.ServicePort {
			sp := svcPort("w", "198.18.0.10", 80, dataplane.UDP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3))
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.1")}
			return sp
		}(),
		"loadBalancer with source ranges": func() dataplane.ServicePort {
			sp := svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3))
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.1")}
			sp.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.128.0/24")}
			return sp
		}(),
		"externalTrafficPolicy Local": func() dataplane.ServicePort {
			sp := np(svcPort("w", "198.18.0.10", 80, dataplane.TCP, local(be("198.19.1.2", 8080, 1)), be("198.19.1.3", 8080, 3), local(be("198.19.1.4", 8080, 3))))
			sp.ExternalLocal = true
			sp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.1")}
			return sp
		}(),
		"externalTrafficPolicy Local without local endpoints": func() dataplane.ServicePort {
			sp := np(svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3", 8080, 3)))
			sp.ExternalLocal = true
			return sp
		}(),
		"internalTrafficPolicy Local": func() dataplane.ServicePort {
			sp := svcPort("w", "198.18.0.10", 80, dataplane.TCP, local(be("198.19.1.2", 8080, 1)), be("198.19.1.3", 8080, 3))
			sp.InternalLocal = true
			return sp
		}(),
		"internalTrafficPolicy Local without local endpoints": func() dataplane.ServicePort {
			sp := svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3", 8080, 3))
			sp.InternalLocal = true
			return sp
		}(),
		"ClientIP affinity": func() dataplane.ServicePort {
			sp := np(svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3)))
			sp.AffinitySeconds = 600
			return sp
		}(),
		"topology": svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), far(be("198.19.1.3", 8080, 3)), be("198.19.1.4", 8080, 3)),
		"reject without endpoints": func() dataplane.ServicePort {
			sp := np(svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3", 8080, 0)))
			sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.1")}
			return sp
		}(),
		"fractional weights": svcPort("w", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 0.9), be("198.19.1.3", 8080, 89.1), be("198.19.1.4", 8080, 10)),
	}
	for name, sp := range cases {
		t.Run(name, func(t *testing.T) {
			p, _ := newTest(t, 4)
			p.NodeAddresses = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("198.19.200.1")} }
			s := dataplane.State{Services: []dataplane.ServicePort{sp}}
			if _, err := p.Sync(s, dataplane.FullSync); err != nil {
				t.Fatal(err)
			}
			tr := newTracer(t, p.nft, "198.19.200.1")
			traced := tracedViews(t, tr, s)
			if diff := dataplane.Diff(dataplane.Expected(s), traced); len(diff) > 0 {
				t.Errorf("the tracer disagrees with the desired state:\n%s", strings.Join(diff, "\n"))
			}
			wantMasquerade(t, tr, s)
			// Explain reads the same table: it must say what the tracer found.
			live, err := p.Explain()
			if err != nil {
				t.Fatal(err)
			}
			if diff := dataplane.Diff(traced, live); len(diff) > 0 {
				t.Errorf("explain disagrees with the tracer:\n%s", strings.Join(diff, "\n"))
			}
			// A partial sync with nothing changed writes nothing.
			var ops string
			nft := p.nft
			p.nft = &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) { ops = tx.String() }}
			if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
				t.Fatal(err)
			}
			p.nft = nft
			if ops != "" {
				t.Errorf("no-op partial sync wrote:\n%s", ops)
			}
		})
	}
}

func TestWeightsBecomeRanges(t *testing.T) {
	for _, ws := range [][]float64{{10, 90}, {1, 2, 3, 4}, {0.9, 89.1, 10}, {1.5, 1.5, 1.5}, {1, 0, 1}} {
		mod, rs := Ranges(ws)
		var total float64
		for _, w := range ws {
			total += w
		}
		next := uint64(0)
		for i, r := range rs {
			n := uint64(0)
			if r[1] >= r[0] {
				if r[0] != next {
					t.Errorf("%v: range %d starts at %d, want %d", ws, i, r[0], next)
				}
				n = r[1] - r[0] + 1
				next = r[1] + 1
			}
			if d := 100*float64(n)/float64(mod) - 100*ws[i]/total; d > 0.01 || d < -0.01 {
				t.Errorf("%v: share %d off by %v points", ws, i, d)
			}
		}
		if next != mod {
			t.Errorf("%v: ranges cover %d of %d", ws, next, mod)
		}
	}
}

func TestFullResyncRepairsHandEdits(t *testing.T) {
	p, nft := newTest(t, 4)
	s := dataplane.State{Services: []dataplane.ServicePort{
		svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 3)),
		svcPort("b", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4", 8080, 1)),
	}}
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// Someone deletes a's service-ips element. (This edit used to come
	// with the flush of an endpoint chain's map that ports without
	// affinity do not have, so the fake refused the whole edit.)
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Element{Map: mapServiceIPs, Key: []string{"198.18.0.10", "tcp", "80"}})
	if err := nft.Run(t.Context(), tx); err != nil {
		t.Fatalf("hand edit: %v", err)
	}
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	wantServed(t, "after the full resync", p, s)
}

// TestFirstSyncInBatches: a first sync of 5 Service ports with BatchPorts
// 2 runs three transactions, none with more than 2 Service ports' chains,
// and ends with every port served.
func TestFirstSyncInBatches(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	old := BatchPorts
	BatchPorts = 2
	defer func() { BatchPorts = old }()
	p, nft := newTest(t, 4)
	var s dataplane.State
	for i := range 5 {
		s.Services = append(s.Services, svcPort(string(rune('a'+i)), netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i)}).String(), 80, dataplane.TCP,
			be(netip.AddrFrom4([4]byte{198, 19, 1, byte(2 + i)}).String(), 8080, 1)))
	}
	var perTx []int
	p.nft = &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) {
		perTx = append(perTx, strings.Count(tx.String(), "add element ip steelyard service-ips"))
	}}
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	p.nft = nft
	if len(perTx) != 3 || perTx[0] > 2 || perTx[1] > 2 || perTx[2] > 2 {
		t.Errorf("Service ports per transaction %v, want 3 transactions of at most 2", perTx)
	}
	wantServed(t, "after a batched first sync", p, s)
}

// TestLaterSyncsAreOneTransaction: once the table holds Service ports, a
// change of more than BatchPorts of them is one transaction (old or new
// state, never a mix, whatever interrupts it).
func TestLaterSyncsAreOneTransaction(t *testing.T) {
	old := BatchPorts
	BatchPorts = 2
	defer func() { BatchPorts = old }()
	p, nft := newTest(t, 4)
	mk := func(w float64) dataplane.State {
		var st dataplane.State
		for i := range 5 {
			st.Services = append(st.Services, svcPort(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.0.%d", 10+i), 80, dataplane.TCP,
				be(fmt.Sprintf("198.19.1.%d", 2+i), 8080, 1), be(fmt.Sprintf("198.19.2.%d", 2+i), 8080, w)))
		}
		return st
	}
	if _, err := p.Sync(mk(1), dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	runs := 0
	p.nft = &spyNFT{Interface: nft, onRun: func(*knftables.Transaction) { runs++ }}
	if _, err := p.Sync(mk(3), dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	if runs != 1 {
		t.Errorf("a change of 5 ports with BatchPorts 2 took %d transactions, want 1", runs)
	}
}
