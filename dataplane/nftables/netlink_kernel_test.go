//go:build e2e

package nftables

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/dataplanetest"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// netlinkStates are the states TestNetlinkMatchesNft walks through: every
// Service shape of the parity table, then endpoint and weight changes.
func netlinkStates() [][]dataplane.State {
	var base []dataplane.ServicePort
	add := func(sp dataplane.ServicePort) { base = append(base, sp) }
	np := func(sp dataplane.ServicePort, port uint16) dataplane.ServicePort { sp.NodePort = port; return sp }
	add(svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90)))
	add(np(svcPort("b", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 2)), 30081))
	e := svcPort("c", "198.18.0.12", 53, dataplane.UDP, be("198.19.1.6", 5353, 1), be("198.19.1.7", 5353, 3))
	e.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.1")}
	add(e)
	lb := svcPort("d", "198.18.0.13", 80, dataplane.TCP, be("198.19.1.8", 8080, 1), be("198.19.1.9", 8080, 3))
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.1")}
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.128.0/24")}
	add(lb)
	el := np(svcPort("e", "198.18.0.14", 80, dataplane.TCP, local(be("198.19.1.10", 8080, 1)), be("198.19.1.11", 8080, 3)), 30082)
	el.ExternalLocal = true
	add(el)
	il := svcPort("f", "198.18.0.15", 80, dataplane.TCP, local(be("198.19.1.12", 8080, 1)), be("198.19.1.13", 8080, 3))
	il.InternalLocal = true
	add(il)
	af := np(svcPort("g", "198.18.0.16", 80, dataplane.TCP, be("198.19.1.14", 8080, 1), be("198.19.1.15", 8080, 3)), 30083)
	af.AffinitySeconds = 600
	add(af)
	add(svcPort("h", "198.18.0.17", 80, dataplane.UDP, be("198.19.1.16", 8080, 0.9), be("198.19.1.17", 8080, 89.1)))
	add(svcPort("v6", "2001:2::10", 80, dataplane.TCP, be("2001:2::1:2", 8080, 1), be("2001:2::1:3", 8080, 2)))
	// Endpoints shared with a: the hairpin set's elements are counted.
	add(svcPort("i", "198.18.0.18", 80, dataplane.TCP, be("198.19.1.2", 8080, 1), be("198.19.1.3", 8080, 1)))
	add(svcPort("v6-shared", "2001:2::11", 80, dataplane.TCP, be("2001:2::1:2", 8080, 1), be("2001:2::1:3", 8080, 2)))
	rw := svcPort("j", "198.18.0.19", 80, dataplane.TCP, be("198.19.1.20", 8080, 1), be("198.19.1.21", 8080, 1))
	rw.RejectWeight = 2 // the reject share: a range without element
	add(rw)
	v6l := np(svcPort("v6-local", "2001:2::12", 53, dataplane.UDP, local(be("2001:2::1:4", 5353, 1)), be("2001:2::1:5", 5353, 3)), 30084)
	v6l.ExternalLocal = true
	add(v6l)
	// A Gateway listener's name longer than nft's comment limit
	// (conformance UDPRouteParentRefPortAndSectionName).
	add(longRoutePort())
	// SCTP: the same shapes with protocol 132 (no sctp module needed to
	// load the rules; the VM suite sends real associations).
	add(np(svcPort("k", "198.18.0.20", 2905, dataplane.SCTP, be("198.19.1.22", 2905, 10), be("198.19.1.23", 2905, 90)), 30085))
	add(np(svcPort("v6-sctp", "2001:2::13", 2905, dataplane.SCTP, be("2001:2::1:6", 2905, 1), be("2001:2::1:7", 2905, 3)), 30086))

	type mut func(i int, sp *dataplane.ServicePort)
	muts := []mut{
		nil,
		func(_ int, sp *dataplane.ServicePort) { sp.Backends[0].Weight = 7 }, // weight change
		func(i int, sp *dataplane.ServicePort) { // one endpoint more
			b := sp.Backends[0]
			if b.IP.Is4() {
				b.IP = netip.AddrFrom4([4]byte{198, 19, 2, byte(i + 2)})
			} else {
				b.IP = netip.MustParseAddr("2001:2::2:2")
			}
			sp.Backends = append(sp.Backends, b)
		},
		func(_ int, sp *dataplane.ServicePort) { sp.Backends = sp.Backends[1:] }, // one endpoint less
		func(_ int, sp *dataplane.ServicePort) { sp.Backends = nil },             // no endpoints
		nil,
		func(i int, sp *dataplane.ServicePort) { // a Service goes, another comes
			if i == 0 {
				sp.Name.Name = "a-renamed"
			}
		},
	}
	// steps[k][j]: Services 0..j as in step k, the others as in step k-1.
	var steps [][]dataplane.State
	for k := range muts {
		var row []dataplane.State
		for j := range base {
			var s dataplane.State
			for i, sp := range base {
				c := *sp.Clone()
				c.Detach()
				m := muts[k]
				if i > j && k > 0 {
					m = muts[k-1]
				}
				if m != nil {
					m(i, &c)
				}
				s.Services = append(s.Services, c)
			}
			s.Sort()
			row = append(row, s)
		}
		steps = append(steps, row)
	}
	return steps
}

// TestNetlinkMatchesNft runs against the real kernel and nft (as root, in a
// throwaway network namespace it creates): the table left by partial syncs
// written over netlink must list exactly as the table nft writes from the
// same final state. The oracle is nft itself.
func TestNetlinkMatchesNft(t *testing.T) {
	if inThrowawayNetns(t, "STEELYARD_NFT_NETNS", "synl") {
		netlinkMatchesNft(t)
	}
}

func netlinkMatchesNft(t *testing.T) {
	for _, family := range []int{4, 6} {
		cfg := testCfg
		cfg.Family = family
		cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("2001:2::/64"))
		f := famOf(family)
		// list returns the table's bytecode (what the packet path runs;
		// the text listing alone hides byteorder steps) and its listing.
		list := func() string {
			out, err := exec.Command("nft", "--debug=netlink", "list", "table", string(f.nfFamily), TableName).CombinedOutput()
			if err != nil {
				t.Fatalf("nft list table: %v: %s", err, out)
			}
			return string(out)
		}
		steps := netlinkStates()
		p, err := NewKernel(cfg)
		if err != nil {
			t.Fatal(err)
		}
		first := steps[0][len(steps[0])-1]
		if _, err := p.Sync(first, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		viaNetlink, partials := 0, 0
		for i, row := range steps[1:] {
			for _, s := range row {
				if _, err := p.Sync(s, dataplane.SyncRequest{}); err != nil {
					t.Fatalf("family %d, step %d: %v", family, i+1, err)
				}
				partials++
				if p.lastNetlink {
					viaNetlink++
				}
			}
			s := row[len(row)-1]
			// Reap what the step left stale, so both tables hold the same.
			time.Sleep(StaleDelay + 50*time.Millisecond)
			if _, err := p.Sync(s, dataplane.SyncRequest{}); err != nil {
				t.Fatalf("family %d, state %d, reap: %v", family, i+1, err)
			}
			got := list()
			if _, err := p.Explain(); err != nil {
				t.Errorf("family %d, state %d: explain: %v", family, i+1, err)
			}

			// The same state written by nft alone into a fresh table.
			nft, err := knftables.New(f.nfFamily, TableName, knftables.UseNetlink)
			if err != nil {
				t.Fatal(err)
			}
			ref := NewProxier(nft, cfg)
			if err := ref.Cleanup(); err != nil {
				t.Fatal(err)
			}
			if _, err := ref.Sync(s, dataplane.FullSync); err != nil {
				t.Fatal(err)
			}
			want := list()
			if canonicalDebug(got) != canonicalDebug(want) {
				t.Fatalf("family %d, state %d: netlink-written table differs from nft's\n--- got\n%s\n--- want\n%s", family, i+1, got, want)
			}
			// p goes on from the reference table, which holds what p wrote.
		}
		// A full resync reads the shared maps over netlink: an element
		// deleted by hand comes back, a foreign one goes, the rest stays.
		last := steps[len(steps)-1]
		final := last[len(last)-1]
		before := list()
		key := "198.18.0.11 . tcp . 80"
		if family == 6 {
			key = "2001:2::10 . tcp . 80"
		}
		for _, cmd := range []string{
			"delete element " + string(f.nfFamily) + " steelyard service-ips { " + key + " }",
			"add element " + string(f.nfFamily) + " steelyard service-nodeports { tcp . 31999 : goto reject-chain }",
		} {
			if out, err := exec.Command("nft", cmd).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", cmd, err, out)
			}
		}
		if _, err := p.Sync(final, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		// Once repaired, a full resync writes the fixed chains only.
		if _, err := p.Sync(final, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		if p.lastOps > 60 {
			t.Errorf("family %d: a full resync of an unchanged table wrote %d operations", family, p.lastOps)
		}
		t.Logf("family %d: full resync of an unchanged table: %d operations", family, p.lastOps)
		// Nobody committed since: the generation says so, and the full
		// resync does not list the table. A foreign commit anywhere in
		// the namespace makes the next one list and repair again.
		if p.lastListed {
			t.Errorf("family %d: a full resync right after our own commit listed the table", family)
		}
		if out, err := exec.Command("nft", "add table inet steelyard-foreign; delete table inet steelyard-foreign").CombinedOutput(); err != nil {
			t.Fatalf("foreign commit: %v: %s", err, out)
		}
		if _, err := p.Sync(final, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		if !p.lastListed {
			t.Errorf("family %d: a full resync after a foreign commit did not list the table", family)
		}
		if after := list(); canonicalDebug(after) != canonicalDebug(before) {
			t.Errorf("family %d: full resync did not repair the shared maps\n--- got\n%s\n--- want\n%s", family, after, before)
		}
		if viaNetlink == 0 {
			t.Errorf("family %d: no partial sync went over netlink", family)
		}
		t.Logf("family %d: %d of %d partial syncs over netlink", family, viaNetlink, partials)
		splitRulesOverNetlink(t, p, list)
		if err := p.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
	dualStackGeneration(t)
}

// dualStackGeneration: the agent's two Proxiers share one generation, so
// each family's commits do not make the other's full resync list again,
// while a foreign commit makes both list.
func dualStackGeneration(t *testing.T) {
	cfg := testCfg
	cfg.ClusterCIDRs = append(cfg.ClusterCIDRs, netip.MustParsePrefix("2001:2::/64"))
	v4, v6, err := newKernelPair(cfg)
	if err != nil {
		t.Fatal(err)
	}
	steps := netlinkStates()
	s := steps[0][len(steps[0])-1]
	sync := func(what string, wantListed bool) {
		t.Helper()
		for _, p := range []*Proxier{v4, v6} {
			if _, err := p.Sync(s, dataplane.FullSync); err != nil {
				t.Fatal(err)
			}
			if p.lastListed != wantListed {
				t.Errorf("%s: family %d listed=%v, want %v", what, p.cfg.Family, p.lastListed, wantListed)
			}
		}
	}
	sync("first sync", true)
	sync("full resync after both families' own commits", false)
	if out, err := exec.Command("nft", "add table inet steelyard-foreign; delete table inet steelyard-foreign").CombinedOutput(); err != nil {
		t.Fatalf("foreign commit: %v: %s", err, out)
	}
	sync("full resync after a foreign commit", true)
	sync("full resync after that", false)
	for _, p := range []*Proxier{v4, v6} {
		if err := p.Cleanup(); err != nil {
			t.Fatal(err)
		}
	}
}

// splitRulesOverNetlink: every split chain of the ports without affinity
// flushed and its rules (the masquerade check, the DNAT-map rule) written
// again in one netlink batch; the table's bytecode must
// be what nft wrote. (Endpoint changes rewrite only map elements, so the
// walk above rarely sends a split rule over netlink.)
func splitRulesOverNetlink(t *testing.T, p *Proxier, list func() string) {
	t.Helper()
	before := list()
	tx := &ops{}
	n := 0
	for _, name := range sortedPorts(p.eng.AppliedPorts()) {
		o := p.renderPort(p.eng.Applied(name))
		if o.src.AffinitySeconds > 0 {
			continue // its "saddr @af- goto" rules go through nft, as before
		}
		for _, c := range o.order {
			if !strings.HasPrefix(c, svcPrefix) && !strings.HasPrefix(c, svlPrefix) {
				continue
			}
			tx.Flush(&knftables.Chain{Name: c})
			for _, r := range o.chains[c] {
				tx.AddRule(c, knftables.PtrTo(commentOf(name, "")), r)
			}
			n++
		}
	}
	c, err := p.netlink.build(tx)
	if err != nil {
		t.Fatalf("family %d: split rules not encoded over netlink: %v", p.cfg.Family, err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("family %d: netlink batch: %v", p.cfg.Family, err)
	}
	if after := list(); canonicalDebug(after) != canonicalDebug(before) {
		t.Errorf("family %d: split rules written over netlink differ from nft's\n--- got\n%s\n--- want\n%s", p.cfg.Family, after, before)
	}
	t.Logf("family %d: %d split chains rewritten over netlink", p.cfg.Family, n)
}

// BenchmarkKernelFirstSync is the first sync of STEELYARD_FIRSTSYNC_SERVICES
// (default 10000) Service ports x STEELYARD_FIRSTSYNC_ENDPOINTS (default 10)
// endpoints into an empty table of a
// test namespace's kernel: wall time, and the CPU split into user and
// system (the kernel's work on each batch is charged to the process that
// sends it, nft), children included. STEELYARD_FIRSTSYNC_CPUPROFILE writes
// a CPU profile of the sync (steelyard's Go only); STEELYARD_FIRSTSYNC_BATCH
// sets BatchPorts. Figures only:
//
//	go test -tags e2e -run '^$' -bench KernelFirstSync -benchtime 1x ./dataplane/nftables/
func BenchmarkKernelFirstSync(b *testing.B) {
	benchInSandbox(b, kernelFirstSync, "STEELYARD_FIRSTSYNC_SERVICES", "STEELYARD_FIRSTSYNC_ENDPOINTS", "STEELYARD_FIRSTSYNC_CPUPROFILE", "STEELYARD_FIRSTSYNC_BATCH")
}

// servicesEnv is the Service count a kernel benchmark's variable key
// gives, 10,000 when unset.
func servicesEnv(key string) string {
	if n := os.Getenv(key); n != "" {
		return n
	}
	return "10000"
}

// benchInSandbox runs the benchmark b once as root in the node namespace
// of a sandbox: the test binary runs itself there with STEELYARD_NLX_CHILD
// and the environment variables named by pass, and that child runs body.
func benchInSandbox(b *testing.B, body func(testing.TB), pass ...string) {
	if os.Getenv("STEELYARD_NLX_CHILD") != "" {
		body(b)
		return
	}
	s := sandbox.NewT(b, sandbox.Options{})
	sandbox.ExecTimeout = 30 * time.Minute
	args := []string{"env", "STEELYARD_NLX_CHILD=1"}
	for _, k := range pass {
		args = append(args, k+"="+os.Getenv(k))
	}
	args = append(args, os.Args[0], "-test.run", "^$", "-test.bench", "^"+b.Name()+"$",
		"-test.benchtime", "1x", "-test.v", "-test.timeout", "30m")
	out, err := s.Node.Exec(args...)
	b.Logf("in %s:\n%s", s.Node.Name, out)
	if err != nil {
		b.Fatal(err)
	}
}

func kernelFirstSync(t testing.TB) {
	count, eps, batch := 10000, 10, 0
	for k, v := range map[string]*int{"STEELYARD_FIRSTSYNC_SERVICES": &count, "STEELYARD_FIRSTSYNC_ENDPOINTS": &eps, "STEELYARD_FIRSTSYNC_BATCH": &batch} {
		if s := os.Getenv(k); s != "" {
			if _, err := fmt.Sscan(s, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if batch > 0 {
		BatchPorts = batch
	}
	s := dataplanetest.Synthetic(count, eps)
	p, err := NewKernel(testCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup() //nolint:errcheck
	if prof := os.Getenv("STEELYARD_FIRSTSYNC_CPUPROFILE"); prof != "" {
		f, err := os.Create(prof)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	var r0, r1 [2]syscall.Rusage // self, children
	usage := func(r *[2]syscall.Rusage) {
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r[0])
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &r[1])
	}
	sec := func(get func(syscall.Rusage) syscall.Timeval) float64 {
		var d float64
		for i := range r0 {
			a, b := get(r0[i]), get(r1[i])
			d += float64(b.Sec-a.Sec) + float64(b.Usec-a.Usec)/1e6
		}
		return d
	}
	usage(&r0)
	start := time.Now()
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	usage(&r1)
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("first sync of %d x %d (BatchPorts %d, netlink %v): wall %.2f s, CPU user %.2f s, system %.2f s; load %s",
		count, eps, BatchPorts, p.lastNetlink, wall.Seconds(),
		sec(func(r syscall.Rusage) syscall.Timeval { return r.Utime }), sec(func(r syscall.Rusage) syscall.Timeval { return r.Stime }),
		strings.Join(strings.Fields(string(load))[:3], " "))
}
