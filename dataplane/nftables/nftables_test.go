package nftables

// Test IP plan (198.18.0.0/15 and 2001:2::/48 only):
//   VIPs 198.18.0.10 .., pods 198.19.1.2 .. (cluster CIDR 198.19.0.0/17).

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

var testCfg = Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}}

func svcPort(name, vip string, vport uint16, proto dataplane.Protocol, backends ...dataplane.Backend) dataplane.ServicePort {
	return dataplane.ServicePort{
		Name:     dataplane.ServicePortName{Namespace: "default", Name: name, Port: "http"},
		VIP:      dataplane.VIP{IP: netip.MustParseAddr(vip), Port: vport, Protocol: proto},
		Backends: backends,
	}
}

func be(ip string, port uint16, w float64) dataplane.Backend {
	return dataplane.Backend{IP: netip.MustParseAddr(ip), Port: port, Weight: w, Ready: true, Serving: true}
}

// newTest returns a Proxier over knftables.Fake, or over the real nft when
// STEELYARD_NFT_REAL=1 (run it in a throwaway network namespace:
// unshare -n go test ...).
func newTest(t testing.TB, family int) (*Proxier, knftables.Interface) {
	t.Helper()
	f := famOf(family)
	if os.Getenv("STEELYARD_NFT_REAL") == "1" {
		nft, err := knftables.New(f.nfFamily, TableName, knftables.UseNetlink)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testCfg
		cfg.Family = family
		p := NewProxier(nft, cfg)
		p.readLive = func() (*liveTable, error) { return readKernel(family) }
		t.Cleanup(func() { _ = p.Cleanup() })
		return p, nft
	}
	nft := knftables.NewFake(f.nfFamily, TableName)
	cfg := testCfg
	cfg.Family = family
	p := NewProxier(nft, cfg)
	fakeLive(p)
	return p, nft
}

// sharesOf is what the tracer finds at every clusterIP of p's table (the
// Service ports named by the comments of service-ips and
// no-endpoint-services) for a client off the cluster: the endpoints'
// shares, and "reject": 1 for a refused port. Against the real nft
// (STEELYARD_NFT_REAL=1, no Fake to trace) it asks Explain.
func sharesOf(t *testing.T, p *Proxier) map[string]map[string]float64 {
	t.Helper()
	fake := fakeOf(p.nft)
	if fake == nil {
		return explainedShares(t, p)
	}
	tr := newTracer(t, fake)
	src := offCluster4
	if p.cfg.Family == 6 {
		src = offCluster6
	}
	out := map[string]map[string]float64{}
	for _, m := range []string{mapServiceIPs, mapNoEndpointServices} {
		fm := fake.Table.Maps[m]
		if fm == nil {
			continue
		}
		for _, e := range fm.Elements {
			if e.Comment == nil || strings.HasSuffix(*e.Comment, kindExternalIP) || strings.HasSuffix(*e.Comment, kindLoadBalancer) {
				continue // the clusterIPs only
			}
			k := fieldsOf(e.Key)
			port, err := strconv.ParseUint(k[2], 10, 16)
			if err != nil {
				t.Fatalf("key %q", e.Key)
			}
			o := tr.trace(pkt{src: src, dst: netip.MustParseAddr(k[0]), proto: k[1], port: uint16(port)})
			if o.pass > 0 || o.drop > 0 {
				t.Errorf("%s: %v", *e.Comment, o)
			}
			shares := map[string]float64{}
			for ap, share := range o.endpoints {
				shares[ap.String()] = dataplane.RoundShare(share)
			}
			if len(shares) == 0 && o.reject > 99.9999 {
				shares["reject"] = 1
			}
			out[*e.Comment] = shares
		}
	}
	return out
}

// fakeOf is the knftables Fake behind nft, or nil.
func fakeOf(nft knftables.Interface) *knftables.Fake {
	for {
		switch x := nft.(type) {
		case *knftables.Fake:
			return x
		case *spyNFT:
			nft = x.Interface
		default:
			return nil
		}
	}
}

func explainedShares(t *testing.T, p *Proxier) map[string]map[string]float64 {
	t.Helper()
	views, err := p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, v := range views {
		if len(v.Problems) > 0 {
			t.Errorf("%s: problems %v", v.Key(), v.Problems)
		}
		m := map[string]float64{}
		for _, b := range v.Backends {
			m[netip.AddrPortFrom(netip.MustParseAddr(b.IP), b.Port).String()] = b.Share
		}
		if v.Reject {
			m["reject"] = 1
		}
		out[v.Service] = m
	}
	return out
}

func TestExplainSharesEqualWeights(t *testing.T) {
	cases := map[string][]float64{
		"10/90":      {10, 90},
		"1:2:3:4":    {1, 2, 3, 4},
		"fractional": {0.9, 89.1, 10},
		"thirds":     {1.5, 1.5, 1.5},
		"one":        {5},
	}
	for name, ws := range cases {
		t.Run(name, func(t *testing.T) {
			p, _ := newTest(t, 4)
			sp := svcPort("web", "198.18.0.10", 80, dataplane.TCP)
			var total float64
			for i, w := range ws {
				sp.Backends = append(sp.Backends, be("198.19.1."+string(rune('2'+i)), 8080, w))
				total += w
			}
			if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{sp}}, dataplane.FullSync); err != nil {
				t.Fatal(err)
			}
			got := sharesOf(t, p)["default/web:http"]
			for _, b := range sp.Backends {
				want := 100 * b.Weight / total
				if d := math.Abs(got[b.Addr().String()] - want); d > 0.01 {
					t.Errorf("%s: share %v, want %v", b.Addr(), got[b.Addr().String()], want)
				}
			}
			// Explain reads the same shares.
			st := dataplane.State{Services: []dataplane.ServicePort{sp}}
			wantServed(t, name, p, st)
			live, _ := p.Explain()
			if diff := dataplane.Diff(dataplane.Expected(st), live); len(diff) > 0 {
				t.Errorf("explain:\n%s", strings.Join(diff, "\n"))
			}
		})
	}
}

func TestPartialSyncWritesOnlyTheChange(t *testing.T) {
	p, nft := newTest(t, 4)
	a := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 1))
	b := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// b changes: one endpoint replaced, weights 1:3.
	b2 := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.6", 8080, 3))
	var ops []string
	spy := &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) { ops = strings.Split(tx.String(), "\n") }}
	p.nft = spy
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b2}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	p.nft = nft
	// The stale endpoint chain is flushed now and deleted a second later.
	advance(p, 2*StaleDelay)
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b2}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if strings.Contains(op, "default/a") || strings.Contains(op, "198.19.1.2") || strings.Contains(op, "198.18.0.10") {
			t.Errorf("partial sync touched Service a: %s", op)
		}
		if strings.HasPrefix(op, "flush chain") && !strings.Contains(op, "/b/") && !strings.Contains(op, "default/b") {
			t.Errorf("partial sync flushed %s", op)
		}
	}
	got := sharesOf(t, p)
	if got["default/b:http"]["198.19.1.6:8080"] != 75 || got["default/a:http"]["198.19.1.2:8080"] != 50 {
		t.Errorf("shares %v", got)
	}
	if _, ok := got["default/b:http"]["198.19.1.5:8080"]; ok {
		t.Errorf("removed endpoint still served: %v", got)
	}
	chains, _ := p.nft.List(t.Context(), "chains")
	for _, c := range chains {
		if strings.Contains(c, "198.19.1.5") {
			t.Errorf("stale endpoint chain %s left", c)
		}
	}
	// b goes away, a loses its endpoints: reject.
	a2 := svcPort("a", "198.18.0.10", 80, dataplane.TCP)
	for range 2 {
		if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a2}}, dataplane.PartialSync); err != nil {
			t.Fatal(err)
		}
		advance(p, 2*StaleDelay)
	}
	got = sharesOf(t, p)
	if len(got) != 1 || got["default/a:http"]["reject"] != 1 {
		t.Errorf("after removal: %v", got)
	}
	chains, _ = p.nft.List(t.Context(), "chains")
	for _, c := range chains {
		if strings.HasPrefix(c, svcPrefix) || strings.HasPrefix(c, epPrefix) {
			t.Errorf("stale chain %s left", c)
		}
	}
}

type spyNFT struct {
	knftables.Interface
	onRun func(*knftables.Transaction)
}

func (s *spyNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	s.onRun(tx)
	return s.Interface.Run(ctx, tx)
}

func TestFullSyncRemovesStaleChains(t *testing.T) {
	p, nft := newTest(t, 4)
	a := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
	b := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// A restarted agent knows nothing of what was applied.
	p2 := NewProxier(nft, p.cfg)
	for range 2 {
		if _, err := p2.Sync(dataplane.State{Services: []dataplane.ServicePort{a}}, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		advance(p2, 2*StaleDelay)
	}
	chains, _ := nft.List(t.Context(), "chains")
	n := 0
	for _, c := range chains {
		if strings.Contains(c, "/b/") || strings.Contains(c, "198.19.1.4") {
			t.Errorf("stale chain %s left", c)
		}
		if strings.HasPrefix(c, svcPrefix) || strings.HasPrefix(c, epPrefix) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d Service/endpoint chains, want 1 (no endpoint chains without affinity): %v", n, chains)
	}
	if got := sharesOf(t, p2); len(got) != 1 {
		t.Errorf("views %v", got)
	}
}

func TestCleanupLeavesOtherTablesAlone(t *testing.T) {
	p, nft := newTest(t, 4)
	real := os.Getenv("STEELYARD_NFT_REAL") == "1"
	if real {
		// A neighbour table in the same (throwaway) network namespace.
		if out, err := exec.Command("nft", "add table ip neighbour; add chain ip neighbour c; add rule ip neighbour c counter").CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		defer exec.Command("nft", "delete table ip neighbour").Run()
	}
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	var ops string
	p.nft = &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) { ops = tx.String() }}
	if err := p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(ops) != "delete table ip steelyard" {
		t.Errorf("cleanup ran %q", ops)
	}
	if chains, err := nft.List(t.Context(), "chains"); !knftables.IsNotFound(err) {
		t.Errorf("table left: %v %v", chains, err)
	}
	if real {
		if out, err := exec.Command("nft", "list table ip neighbour").CombinedOutput(); err != nil || !strings.Contains(string(out), "counter") {
			t.Errorf("neighbour table: %v %s", err, out)
		}
	}
	if err := p.Cleanup(); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestIPv6(t *testing.T) {
	p, _ := newTest(t, 6)
	sp := svcPort("v6", "2001:2::10", 80, dataplane.TCP, be("2001:2:0:1::2", 8080, 10), be("2001:2:0:1::3", 8080, 90))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{sp}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	got := sharesOf(t, p)["default/v6:http"]
	if got["[2001:2:0:1::2]:8080"] != 10 || got["[2001:2:0:1::3]:8080"] != 90 {
		t.Errorf("shares %v", got)
	}
}

// advance moves p's clock forward by d.
func advance(p *Proxier, d time.Duration) {
	now := p.now()
	p.now = func() time.Time { return now.Add(d) }
}

// "nft flush ruleset" (or a deleted table) between syncs: the next partial
// sync finds the table gone, goes full, says so, and everything is back.
func TestPartialSyncAfterFlushGoesFull(t *testing.T) {
	p, nft := newTest(t, 4)
	st := dataplane.State{Services: []dataplane.ServicePort{svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 9))}}
	if _, err := p.Sync(st, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	res, err := p.Sync(st, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}})
	if err != nil || res.Full {
		t.Fatalf("nothing changed: result %+v, %v; want partial", res, err)
	}
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	res, err = p.Sync(st, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}})
	if err != nil || !res.Full {
		t.Fatalf("after a flush: result %+v, %v; want full", res, err)
	}
	wantServed(t, "not repaired", p, st)
}

// Explain reads the fixed masquerading chains too: flushed, every
// forwarded VIP carries a hairpin problem (no share shows it).
func TestExplainSeesMasqueradingFlushed(t *testing.T) {
	p, nft := newTest(t, 4)
	st := dataplane.State{Services: []dataplane.ServicePort{svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))}}
	if _, err := p.Sync(st, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	views, err := p.Explain()
	if err != nil || len(views) != 1 || len(views[0].Problems) != 0 {
		t.Fatalf("before: %+v, %v; want one view without problems", views, err)
	}
	tx := nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: chainMasquerading})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	views, err = p.Explain()
	if err != nil || len(views) != 1 || len(views[0].Problems) != 1 || !strings.Contains(views[0].Problems[0], "hairpin") {
		t.Fatalf("after a flush of %s: %+v, %v; want one hairpin problem", chainMasquerading, views, err)
	}
}

// TestEndpointChurnKeepsTheDrawRule: when endpoints come and go, only the
// weight map's elements change; the split chain, whose rule draws numgen,
// is not rewritten. Rewriting it with a new modulus in the same
// transaction as the map lets a few new connections find no element (see
// Buckets); so does emptying the chain of a removed endpoint in that
// transaction. The real-API-server churn test saw them as 3-6 timeouts in
// 100,000 connections.
func TestEndpointChurnKeepsTheDrawRule(t *testing.T) {
	p, nft := newTest(t, 4)
	var five, seven []dataplane.Backend
	for i := range 7 {
		b := be(fmt.Sprintf("198.19.2.%d", i+2), 8080, 1)
		if i < 5 {
			five = append(five, b)
		}
		seven = append(seven, b)
	}
	state := func(bs []dataplane.Backend) dataplane.State {
		return dataplane.State{Services: []dataplane.ServicePort{svcPort("churn", "198.18.0.20", 80, dataplane.TCP, bs...)}}
	}
	if _, err := p.Sync(state(five), dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	for i, bs := range [][]dataplane.Backend{seven, five, seven} {
		var ops []string
		p.nft = &spyNFT{Interface: nft, onRun: func(tx *knftables.Transaction) { ops = append(ops, strings.Split(tx.String(), "\n")...) }}
		if _, err := p.Sync(state(bs), dataplane.PartialSync); err != nil {
			t.Fatal(err)
		}
		p.nft = nft
		for _, op := range ops {
			if strings.Contains(op, "numgen") || (strings.Contains(op, "chain") && strings.Contains(op, svcPrefix)) {
				t.Errorf("change %d (%d endpoints) rewrote the split: %s", i, len(bs), op)
			}
		}
		// The chains of removed endpoints stay intact in the transaction
		// that unlinks them (flushed and deleted later); a chain flushed
		// here must be refilled here.
		for _, op := range ops {
			if chain, ok := strings.CutPrefix(op, "flush chain ip steelyard "); ok && !slices.ContainsFunc(ops, func(o string) bool {
				return strings.HasPrefix(o, "add rule ip steelyard "+chain+" ")
			}) {
				t.Errorf("change %d (%d endpoints) emptied chain %s at once", i, len(bs), chain)
			}
			if strings.HasPrefix(op, "delete chain") {
				t.Errorf("change %d (%d endpoints) deleted a chain at once: %s", i, len(bs), op)
			}
		}
		got := sharesOf(t, p)["default/churn:http"]
		if len(got) != len(bs) {
			t.Errorf("change %d: %d backends served, want %d: %v", i, len(got), len(bs), got)
		}
		advance(p, 2*StaleDelay)
	}
}

// A Service that goes and one that comes with its VIP in the same partial
// sync: the newcomer owns the VIP afterwards (the old port's element was
// once deleted after the new one had been skipped as a duplicate).
func TestVIPHandedOverInOneSync(t *testing.T) {
	p, _ := newTest(t, 4)
	old := svcPort("b-old", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{old}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	// "a-new" sorts before "b-old": the order of names must not matter.
	nu := svcPort("a-new", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{nu}}, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	got := sharesOf(t, p)
	if len(got) != 1 || got["default/a-new:http"]["198.19.1.3:8080"] != 100 {
		t.Errorf("after the hand-over: %v", got)
	}
}
