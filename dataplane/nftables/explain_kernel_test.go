//go:build e2e

package nftables

import (
	"cmp"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"runtime/pprof"
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
// TestNetlinkMatchesNft, what readKernel reads (google/nftables and the
// rule dump, decoded into the model) must be the model the Proxier wrote,
// statement by statement and element by element; every rule of the
// Service chains must read back as exactly the line nft lists for it; and
// Explain must give the same views from the kernel as from the model,
// which verify finds equal to the desired state.
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
		if live, err := readKernel(family); err != nil || live != nil {
			t.Fatalf("family %d: no table yet: read %v, %v", family, live, err)
		}
		for i, s := range explainStates() {
			req := dataplane.SyncRequest{}
			if i == 0 {
				req = dataplane.FullSync
			}
			if _, err := p.Sync(s, req); err != nil {
				t.Fatalf("family %d, state %d: %v", family, i, err)
			}
			compareWithModel(t, p, s, fmt.Sprintf("family %d, state %d", family, i))
		}
		// The layout's own shapes were among them: a split that DNATs
		// through its data map, and the shared hairpin set.
		live, err := readKernel(family)
		if err != nil {
			t.Fatal(err)
		}
		dnat := false
		for _, rules := range live.chains {
			for _, rl := range rules {
				for _, st := range rl {
					_, ok := st.(numgenDNAT)
					dnat = dnat || ok
				}
			}
		}
		if !dnat || len(live.hairpin) == 0 {
			t.Errorf("family %d: DNAT-map split read: %v, hairpin elements read: %d", family, dnat, len(live.hairpin))
		}
		if err := p.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}

// nftChains is nft's listing of the table: each chain's rule lines,
// comments cut off (the oracle, parsed here and not by the code under
// test).
func nftChains(t *testing.T, f fam) map[string][]string {
	t.Helper()
	out, err := exec.Command("nft", "list", "table", string(f.nfFamily), TableName).Output()
	if err != nil {
		t.Fatalf("nft list table: %v", err)
	}
	comment := regexp.MustCompile(`\s+comment\s+"[^"]*"`)
	chains := map[string][]string{}
	lines := strings.Split(string(out), "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		name, ok := strings.CutPrefix(l, "chain ")
		if !ok || !strings.HasSuffix(l, "{") {
			continue
		}
		name = strings.Trim(strings.TrimSpace(strings.TrimSuffix(name, "{")), `"`)
		rules := []string{}
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "}"; i++ {
			r := strings.TrimSpace(lines[i])
			if r == "" || strings.HasPrefix(r, "type ") || strings.HasPrefix(r, "comment ") {
				continue
			}
			rules = append(rules, strings.TrimSpace(comment.ReplaceAllString(r, "")))
		}
		chains[name] = rules
	}
	return chains
}

// compareWithModel checks what readKernel reads against the model p
// wrote and against nft's listing, then Explain's views.
func compareWithModel(t *testing.T, p *Proxier, s dataplane.State, what string) {
	t.Helper()
	live, err := readKernel(p.cfg.Family)
	if err != nil || live == nil {
		t.Fatalf("%s: read the kernel: %v, %v", what, live, err)
	}
	model, err := p.modelTable()
	if err != nil {
		t.Fatal(err)
	}
	listed := nftChains(t, p.f)
	// /32 and /128 source ranges: nft lists the address alone.
	norm := strings.NewReplacer("/32", "", "/128", "").Replace
	for c, want := range model.chains {
		got, ok := live.chains[c]
		if !ok {
			t.Errorf("%s: chain %s not read", what, c)
			continue
		}
		if len(got) != len(want) || len(listed[c]) != len(want) {
			t.Errorf("%s: chain %s: %d rules read, %d listed, model %d", what, c, len(got), len(listed[c]), len(want))
			continue
		}
		for i := range want {
			typed := true
			for j, st := range want[i] {
				if _, ok := st.(nftOnly); ok {
					typed = false
					if j >= len(got[i]) {
						break
					}
					continue
				}
				if j >= len(got[i]) || !stmtEqual(got[i][j], st) {
					if !slices.ContainsFunc(got[i], func(x stmt) bool { return stmtEqual(x, st) }) {
						t.Errorf("%s: chain %s rule %d reads as\n  %s\nthe model wrote\n  %s", what, c, i, got[i].text(p.f), want[i].text(p.f))
						break
					}
				}
			}
			if _, encodes := want[i].encode(p.f); typed && encodes == nil && norm(got[i].text(p.f)) != norm(listed[c][i]) {
				t.Errorf("%s: chain %s rule %d reads as\n  %s\nnft lists\n  %s", what, c, i, got[i].text(p.f), listed[c][i])
			}
			if slices.ContainsFunc([]string{svcPrefix, svlPrefix, extPrefix, fwPrefix, epPrefix}, func(pf string) bool { return strings.HasPrefix(c, pf) }) && slices.ContainsFunc(got[i], func(x stmt) bool { _, ok := x.(opaque); return ok }) {
				t.Errorf("%s: chain %s rule %d: %s", what, c, i, got[i].text(p.f))
			}
		}
	}
	sortShared := func(m map[string][]sharedElem) map[string][]string {
		out := map[string][]string{}
		for name, es := range m {
			for _, e := range es {
				out[name] = append(out[name], fmt.Sprintf("%s : %s # %s", e.e.id(), e.e.to.text(p.f), *e.comment))
			}
			slices.Sort(out[name])
		}
		return out
	}
	if got, want := sortShared(live.shared), sortShared(model.shared); !reflect.DeepEqual(got, want) {
		t.Errorf("%s: shared maps read\n  %v\nthe model wrote\n  %v", what, got, want)
	}
	// A shared weight map's elements, in draw order (the kernel lists
	// them in its own; the model in the order of its ports).
	byDraw := func(es []wmElem) []wmElem {
		es = slices.Clone(es)
		slices.SortFunc(es, func(a, b wmElem) int { return cmp.Compare(a.lo, b.lo) })
		return es
	}
	for m, want := range model.weights {
		got := live.weights[m]
		if got == nil || !reflect.DeepEqual(byDraw(got.elems), byDraw(want.elems)) {
			t.Errorf("%s: weight map %s read %+v, the model wrote %+v", what, m, got, want)
		}
	}
	if !reflect.DeepEqual(live.hairpin, model.hairpin) {
		t.Errorf("%s: %d hairpin elements read; the model wrote %d", what, len(live.hairpin), len(model.hairpin))
	}
	for s, sec := range model.timeouts { // the kernel may still hold stale sets
		if live.timeouts[s] != sec {
			t.Errorf("%s: set %s: timeout %d s read; the model wrote %d", what, s, live.timeouts[s], sec)
		}
	}

	// Explain's views from the kernel and from the model.
	fromKernel, err := p.Explain()
	if err != nil {
		t.Fatalf("%s: explain: %v", what, err)
	}
	saved := p.readLive
	p.readLive = nil
	fromModel, err := p.Explain()
	p.readLive = saved
	if err != nil {
		t.Fatalf("%s: explain the model: %v", what, err)
	}
	if !reflect.DeepEqual(fromKernel, fromModel) {
		t.Errorf("%s: views differ\nkernel: %+v\nmodel:  %+v", what, fromKernel, fromModel)
	}
	if len(fromKernel) == 0 {
		t.Errorf("%s: no views", what)
	}
	var expected []dataplane.ServiceView
	for _, v := range dataplane.Expected(s) {
		if a, err := netip.ParseAddr(v.VIP); err == nil && a.Is6() == (p.cfg.Family == 6) && !v.Reject {
			expected = append(expected, v)
		}
	}
	// Refused ports aside: their desired view keeps attributes (affinity,
	// source ranges) of which a table that refuses them has no trace.
	var forwarded []dataplane.ServiceView
	for _, v := range fromKernel {
		if !v.Reject {
			forwarded = append(forwarded, v)
		}
	}
	if diff := dataplane.Diff(expected, forwarded); len(diff) > 0 {
		t.Errorf("%s: verify finds\n%s", what, strings.Join(diff, "\n"))
	}
	for _, v := range fromKernel {
		if len(v.Problems) > 0 {
			t.Errorf("%s: %s %s:%d: problems %q", what, v.Service, v.VIP, v.Port, v.Problems)
		}
	}
	t.Logf("%s: %d chains, %d weight maps read, %d views", what, len(live.chains), len(live.weights), len(fromKernel))
}

// BenchmarkExplainSources prints what one Explain costs on a table of
// STEELYARD_EXPLAIN_SERVICES Services x 10 endpoints (default 10,000, in a
// sandbox's node namespace): from the kernel twice, and from the model
// (no kernel read) once. STEELYARD_EXPLAIN_CPUPROFILE=FILE writes a CPU
// profile of the second read from the kernel alone;
// STEELYARD_EXPLAIN_READERS=N reads the weight maps over N sockets.
// Figures only:
//
//	go test -tags e2e -run '^$' -bench ExplainSources -benchtime 1x ./dataplane/nftables/
func BenchmarkExplainSources(b *testing.B) {
	benchInSandbox(b, func(t testing.TB) { explainSources(t, servicesEnv("STEELYARD_EXPLAIN_SERVICES")) }, "STEELYARD_EXPLAIN_SERVICES", "STEELYARD_EXPLAIN_CPUPROFILE", "STEELYARD_EXPLAIN_READERS")
}

func explainSources(t testing.TB, n string) {
	var count int
	if _, err := fmt.Sscan(n, &count); err != nil {
		t.Fatal(err)
	}
	// STEELYARD_EXPLAIN_READERS: how many sockets read the weight maps.
	if r := os.Getenv("STEELYARD_EXPLAIN_READERS"); r != "" {
		if _, err := fmt.Sscan(r, &elemReaders); err != nil {
			t.Fatal(err)
		}
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
	for i, src := range []string{"kernel", "model", "kernel"} {
		saved := p.readLive
		if src != "kernel" {
			p.readLive = nil
		}
		// STEELYARD_EXPLAIN_CPUPROFILE: a CPU profile of the last explain
		// from the kernel alone (not the sync before it).
		prof := os.Getenv("STEELYARD_EXPLAIN_CPUPROFILE")
		if prof != "" && i == 2 {
			f, err := os.Create(prof)
			if err != nil {
				t.Fatal(err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				t.Fatal(err)
			}
		}
		start, c := time.Now(), cpu()
		v, err := p.Explain()
		wall, used := time.Since(start), cpu()-c
		if prof != "" && i == 2 {
			pprof.StopCPUProfile()
		}
		p.readLive = saved
		if err != nil {
			t.Fatal(err)
		}
		if src == "kernel" {
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
