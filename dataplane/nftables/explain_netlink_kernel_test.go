//go:build e2e

package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestNetlinkExplainMatchesNft runs against the real kernel and nft, as
// root, in the node namespace of a sandbox it creates (deleted also when
// it fails): for every Service shape, through the same states as
// TestNetlinkMatchesNft, the snapshot read over netlink must hold exactly
// what "nft list table" shows for every chain and set explain follows, and
// Explain must give the same views from either. The oracle is nft's
// listing, parsed by parseTable, and which chains it shows reachable.
func TestNetlinkExplainMatchesNft(t *testing.T) {
	if os.Getenv("STEELYARD_NLX_CHILD") != "" {
		netlinkExplainMatchesNft(t)
		return
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatal("no nft binary (scripts/install-deps.sh installs it)")
	}
	s := sandbox.NewT(t, sandbox.Options{})
	out, err := s.Node.Exec("env", "STEELYARD_NLX_CHILD=1", os.Args[0], "-test.run", "^TestNetlinkExplainMatchesNft$", "-test.v")
	t.Logf("in %s:\n%s", s.Node.Name, out)
	if err != nil {
		t.Fatal(err)
	}
}

// explainStates are netlinkStates' final states plus shapes they lack: a
// reject share, several source ranges (an anonymous set), Local policies
// with source ranges.
func explainStates() []dataplane.State {
	var out []dataplane.State
	for _, row := range netlinkStates() {
		s := row[len(row)-1]
		rj := svcPort("rj", "198.18.0.30", 80, dataplane.TCP, be("198.19.1.30", 8080, 1), be("198.19.1.31", 8080, 1))
		rj.RejectWeight = 2
		rj.NodePort = 30090
		s.Services = append(s.Services, rj)
		lb := svcPort("lb2", "198.18.0.31", 443, dataplane.TCP, local(be("198.19.1.32", 8443, 1)), be("198.19.1.33", 8443, 3))
		lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.2")}
		lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.128.0/24"), netip.MustParsePrefix("198.19.130.0/23"), netip.MustParsePrefix("198.19.140.1/32")}
		lb.ExternalLocal = true
		s.Services = append(s.Services, lb)
		lb6 := svcPort("lb6", "2001:2::31", 443, dataplane.TCP, be("2001:2::1:32", 8443, 1), be("2001:2::1:33", 8443, 3))
		lb6.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("2001:2::2:2")}
		lb6.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:2:0:8000::/64"), netip.MustParsePrefix("2001:2:0:9000::/60")}
		s.Services = append(s.Services, lb6)
		s.Sort()
		out = append(out, s)
	}
	return out
}

func netlinkExplainMatchesNft(t *testing.T) {
	for _, family := range []int{4, 6} {
		cfg := testCfg
		cfg.Family = family
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("2001:2::/64"))
		cfg.LocalhostNodePorts = true
		cfg.NodeAddresses = func() []netip.Addr {
			return []netip.Addr{netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("2001:2::1")}
		}
		p, err := NewKernel(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if snap, err := netlinkSnapshot(family); err != nil || snap != nil {
			t.Fatalf("family %d: no table yet: snapshot %v, %v", family, snap, err)
		}
		for i, s := range explainStates() {
			req := dataplane.SyncRequest{}
			if i == 0 {
				req = dataplane.FullSync
			}
			if _, err := p.Sync(s, req); err != nil {
				t.Fatalf("family %d, state %d: %v", family, i, err)
			}
			compareSnapshots(t, p, fmt.Sprintf("family %d, state %d", family, i), true)
		}
		// The layout's own shapes were among them: a split that DNATs
		// through its data map, and the shared hairpin set.
		f := famOf(family)
		nl, err := netlinkSnapshot(family)
		if err != nil {
			t.Fatal(err)
		}
		dnat, hairpin := false, len(nl.elems[setHairpin]) > 0
		for _, rules := range nl.chains {
			for _, r := range rules {
				dnat = dnat || strings.Contains(r, "dnat "+f.ip+" to numgen random mod ")
			}
		}
		if !dnat || !hairpin {
			t.Errorf("family %d: DNAT-map split read: %v, hairpin elements read: %v", family, dnat, hairpin)
		}
		if err := p.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}

var reNames = regexp.MustCompile(`(?:jump|goto) "?([^"\s]+)"?|@([\w-]+)`)

// compareSnapshots checks the netlink snapshot against nft's listing.
func compareSnapshots(t *testing.T, p *Proxier, what string, healthy bool) {
	t.Helper()
	nl, err := netlinkSnapshot(p.cfg.Family)
	if err != nil {
		t.Fatalf("%s: netlink snapshot: %v", what, err)
	}
	ctx := context.Background()
	txt, err := p.nftSnapshot(ctx)
	if err != nil {
		t.Fatalf("%s: nft list table: %v", what, err)
	}
	// The chains and sets nft's listing shows reachable from where
	// explain starts, found in nft's text (not by the code under test).
	wantChains, wantSets := map[string]bool{}, map[string]bool{}
	var queue []string
	var name func(string)
	name = func(s string) {
		for _, m := range reNames.FindAllStringSubmatch(s, -1) {
			if m[1] != "" && !wantChains[m[1]] {
				wantChains[m[1]] = true
				queue = append(queue, m[1])
			}
			if m[2] != "" && !wantSets[m[2]] {
				wantSets[m[2]] = true
				for _, e := range txt.elems[m[2]] {
					name(e.value)
				}
			}
		}
	}
	for _, c := range []string{chainNATPostrouting, chainMasquerading, chainMarkMasq} {
		name("goto " + c)
	}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts, setNodePortIPs} {
		name("@" + m)
	}
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		for _, r := range txt.chains[c] {
			name(r)
		}
	}
	var gotChains []string
	for c, rules := range nl.chains {
		gotChains = append(gotChains, c)
		if !slices.Equal(rules, txt.chains[c]) {
			t.Errorf("%s: chain %s over netlink:\n  %s\nnft lists:\n  %s", what, c, strings.Join(rules, "\n  "), strings.Join(txt.chains[c], "\n  "))
		}
		for _, r := range rules {
			if strings.HasPrefix(r, "unknown") {
				t.Errorf("%s: chain %s: %s", what, c, r)
			}
		}
	}
	var want []string
	for c := range wantChains {
		if _, ok := txt.chains[c]; ok {
			want = append(want, c)
		}
	}
	slices.Sort(gotChains)
	slices.Sort(want)
	if !slices.Equal(gotChains, want) {
		t.Errorf("%s: netlink read chains %v\nnft shows reachable %v", what, gotChains, want)
	}
	elemText := func(es []snapElem) []string {
		var out []string
		for _, e := range es {
			out = append(out, fmt.Sprintf("%q : %q # %q", e.key, e.value, e.comment))
		}
		slices.Sort(out)
		return out
	}
	for s := range wantSets {
		if strings.HasPrefix(s, affPrefix) {
			continue // filled by the kernel; explain reads its timeout only
		}
		if _, ok := nl.elems[s]; !ok {
			t.Errorf("%s: set %s not read over netlink", what, s)
		}
	}
	for s, es := range nl.elems {
		if got, want := elemText(es), elemText(txt.elems[s]); !slices.Equal(got, want) {
			t.Errorf("%s: elements of %s over netlink:\n  %s\nnft lists:\n  %s", what, s, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
	if !reflect.DeepEqual(nl.timeouts, txt.timeouts) {
		t.Errorf("%s: timeouts over netlink %v, nft lists %v", what, nl.timeouts, txt.timeouts)
	}

	// Explain's views from either source.
	viaNetlink, err := p.Explain()
	if err != nil {
		t.Fatalf("%s: explain over netlink: %v", what, err)
	}
	saved := p.netlink
	p.netlink = nil
	viaNft, err := p.Explain()
	p.netlink = saved
	if err != nil {
		t.Fatalf("%s: explain over nft: %v", what, err)
	}
	if !reflect.DeepEqual(viaNetlink, viaNft) {
		t.Errorf("%s: views differ\nnetlink: %+v\nnft:     %+v", what, viaNetlink, viaNft)
	}
	if len(viaNetlink) == 0 {
		t.Errorf("%s: no views", what)
	}
	if healthy {
		for _, v := range viaNetlink {
			if len(v.Problems) > 0 {
				t.Errorf("%s: %s %s:%d: problems %q", what, v.Service, v.VIP, v.Port, v.Problems)
			}
		}
	}
	t.Logf("%s: %d chains, %d sets read over netlink, %d views", what, len(nl.chains), len(nl.elems), len(viaNetlink))
}

// BenchmarkExplainSources prints what one Explain costs from each source
// on the same table (STEELYARD_EXPLAIN_SERVICES Services x 10 endpoints,
// default 10,000, in a sandbox's node namespace): the netlink reads
// against one "nft list table". Figures only:
//
//	go test -tags e2e -run '^$' -bench ExplainSources -benchtime 1x ./dataplane/nftables/
func BenchmarkExplainSources(b *testing.B) {
	n := os.Getenv("STEELYARD_EXPLAIN_SERVICES")
	if n == "" {
		n = "10000"
	}
	if os.Getenv("STEELYARD_NLX_CHILD") != "" {
		explainSources(b, n)
		return
	}
	s := sandbox.NewT(b, sandbox.Options{})
	sandbox.ExecTimeout = 30 * time.Minute
	out, err := s.Node.Exec("env", "STEELYARD_NLX_CHILD=1", "STEELYARD_EXPLAIN_SERVICES="+n, os.Args[0],
		"-test.run", "^$", "-test.bench", "^BenchmarkExplainSources$", "-test.benchtime", "1x", "-test.v", "-test.timeout", "30m")
	b.Logf("in %s:\n%s", s.Node.Name, out)
	if err != nil {
		b.Fatal(err)
	}
}

func explainSources(t testing.TB, n string) {
	var count int
	if _, err := fmt.Sscan(n, &count); err != nil {
		t.Fatal(err)
	}
	var s dataplane.State
	for i := 0; i < count; i++ {
		sp := svcPort(fmt.Sprintf("svc-%d", i), netip.AddrFrom4([4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}).String(), 80, dataplane.TCP)
		sp.Name.Namespace = "bench"
		for j := 0; j < 10; j++ {
			k := i*10 + j
			sp.Backends = append(sp.Backends, dataplane.Backend{IP: netip.AddrFrom4([4]byte{198, 19, byte((k % 65000) >> 8), byte(k % 65000)}),
				Port: uint16(8080 + k/65000), Weight: float64(1 + j%4), Ready: true, Serving: true})
		}
		s.Services = append(s.Services, sp)
	}
	s.Sort()
	cfg := testCfg
	p, err := NewKernel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup() //nolint:errcheck
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	cpu := func() float64 {
		var self, kids syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
		sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
		return sec(self.Utime) + sec(self.Stime) + sec(kids.Utime) + sec(kids.Stime)
	}
	load := func() string {
		b, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(b))[:3], " ")
	}
	var views [2][]dataplane.ServiceView
	for _, src := range []string{"netlink", "nft list table", "netlink"} {
		saved := p.netlink
		if src != "netlink" {
			p.netlink = nil
		}
		start, c := time.Now(), cpu()
		v, err := p.Explain()
		wall, used := time.Since(start), cpu()-c
		p.netlink = saved
		if err != nil {
			t.Fatal(err)
		}
		if src == "netlink" {
			views[0] = v
		} else {
			views[1] = v
		}
		t.Logf("%d Services, explain from %s: %.2f s wall, %.2f CPU-s, %d views, load average %s", count, src, wall.Seconds(), used, len(v), load())
	}
	if !reflect.DeepEqual(views[0], views[1]) {
		t.Errorf("views differ between the sources")
	}
}
