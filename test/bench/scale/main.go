// Command scale-bench measures one dataplane at one size, inside the
// network namespace it is started in (scripts/bench-scale.sh makes a
// throwaway one per run, never the root namespace), and prints one JSON
// line: first sync, one-endpoint partial sync (median of 5), full resync
// with nothing changed, explain, listing the ruleset, and peak RSS.
// It prints figures and asserts nothing.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
	"github.com/steelyard-net/steelyard/test/bench/scale/point"
	"github.com/steelyard-net/steelyard/test/runinfo"
)

// cpu returns the CPU seconds used so far by this process and its waited-for
// children.
func cpu() float64 {
	var self, kids syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return sec(self.Utime) + sec(self.Stime) + sec(kids.Utime) + sec(kids.Stime)
}

func main() {
	services := flag.Int("services", 10000, "number of Services")
	endpoints := flag.Int("endpoints", 10, "endpoints per Service")
	dp := flag.String("dataplane", "nftables", "nftables, iptables-legacy or iptables-nft")
	keep := flag.Bool("keep", false, "leave the ruleset in place after the first sync and exit (to inspect it)")
	batch := flag.Int("batch", nftables.BatchPorts, "nftables: Service ports per transaction of a full sync")
	cpuProfile := flag.String("cpuprofile", "", "write a pprof CPU profile of the partial syncs (one weight, one endpoint) to this file")
	memProfile := flag.String("memprofile", "", "write pprof heap profiles: FILE.first (live heap after the first sync, after a GC) and FILE.partial (after the partial syncs)")
	perfCtl := flag.String("perf-ctl", "", "a perf record --control fifo: \"enable\" is written before the partial syncs and \"disable\" after them (start perf with -D -1)")
	partialOnly := flag.Bool("partial-only", false, "stop after the partial syncs (no full resync, explain or listing)")
	rounds := flag.Int("rounds", 5, "partial syncs of each kind (the median is printed)")
	probe := flag.Bool("probe", false, "nftables: after the partial syncs, time a commit with a verdict element and one without (the kernel's validation walk)")
	probeOnly := flag.Bool("probe-only", false, "nftables: only -probe the table already there (left by -keep), then exit")
	count := flag.Bool("count-connections", false, "count each endpoint's new connections (nftables: counted maps; iptables: the rules count always) and time one read of the counts")
	flag.Parse()
	nftables.BatchPorts = *batch
	if *probeOnly {
		v, p := probeCommits()
		fmt.Printf("commit with a verdict %.4f CPU-s, without %.4f CPU-s\n", v, p)
		return
	}
	logrus.SetLevel(logrus.WarnLevel)

	state := makeState(*services, *endpoints)
	cidrs := []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}
	var p dataplane.Dataplane
	var list []string
	switch *dp {
	case "nftables":
		np, err := nftables.NewKernel(nftables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: cidrs}, CountConnections: *count})
		if err != nil {
			fail(err)
		}
		p, list = np, []string{"nft", "list", "ruleset"}
	case "iptables-legacy", "iptables-nft":
		mode := strings.TrimPrefix(*dp, "iptables-")
		ipt, _, err := iptables.New(iptables.Mode(mode))
		if err != nil {
			fail(err)
		}
		p, list = iptables.NewProxier(ipt, iptables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: cidrs}, NFAcct: nfacct.Kernel{}, CountConnections: *count}), []string{*dp + "-save"}
	default:
		fail(fmt.Errorf("-dataplane %q: want nftables, iptables-legacy or iptables-nft", *dp))
	}
	r := point.Result{Dataplane: *dp, Services: *services, Endpoints: *endpoints, CountConnections: *count}
	var lastCPU float64
	timed := func(f func() error) float64 {
		start, c := time.Now(), cpu()
		if err := f(); err != nil {
			fail(err)
		}
		lastCPU = cpu() - c
		return time.Since(start).Seconds()
	}
	// phase tells on stderr which step raised the peak RSS.
	phase := func(name string) {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		fmt.Fprintf(os.Stderr, "scale-bench: after %s: peak RSS %.0f MiB\n", name, float64(ru.Maxrss)/1024)
	}
	r.First = timed(func() error { _, err := p.Sync(state, dataplane.FullSync); return err })
	r.FirstCPU = lastCPU
	phase("first sync")
	if *keep {
		fmt.Printf("first sync %.3f s (%.3f s CPU)\n", r.First, r.FirstCPU)
		return
	}
	if *memProfile != "" {
		writeHeap(*memProfile + ".first")
	}
	profiling := startProfiles(*cpuProfile, *perfCtl)
	var partials, partialCPU []float64
	for i := range *rounds {
		// One endpoint of one Service changes weight.
		state.Services[*services/2].Backends[0].Weight = float64(2 + i)
		// The agent passes the tracker's changed set: that one Service.
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{state.Services[*services/2].Name.Service(): true}}
		partials = append(partials, timed(func() error { _, err := p.Sync(state, req); return err }))
		partialCPU = append(partialCPU, lastCPU)
	}
	slices.Sort(partials)
	slices.Sort(partialCPU)
	r.Partial, r.PartialCPU = partials[len(partials)/2], partialCPU[len(partialCPU)/2]
	// median runs f five times and returns the median wall and CPU times.
	median := func(f func(i int) error) (float64, float64) {
		var ws, cs []float64
		for i := range *rounds {
			ws = append(ws, timed(func() error { return f(i) }))
			cs = append(cs, lastCPU)
		}
		slices.Sort(ws)
		slices.Sort(cs)
		return ws[len(ws)/2], cs[len(cs)/2]
	}
	// One endpoint replaced by a never-used address (pod churn).
	sp := &state.Services[*services/3]
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sp.Name.Service(): true}}
	r.Endpoint, r.EndpointCPU = median(func(i int) error {
		sp.Backends[0].IP = netip.AddrFrom4([4]byte{198, 19, 255, byte(10 + i%200)})
		_, err := p.Sync(state, req)
		return err
	})
	profiling()
	phase("partial syncs")
	if *probe && *dp == "nftables" {
		r.VerdictCommitCPU, r.PlainCommitCPU = probeCommits()
	}
	if *memProfile != "" {
		writeHeap(*memProfile + ".partial")
	}
	if *partialOnly {
		printResult(r)
		return
	}
	// A periodic sync with nothing changed.
	r.Idle, r.IdleCPU = median(func(int) error {
		_, err := p.Sync(state, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}})
		return err
	})
	r.Full = timed(func() error { _, err := p.Sync(state, dataplane.FullSync); return err })
	r.FullCPU = lastCPU
	phase("full resync")
	r.Explain = timed(func() error {
		views, err := p.Explain()
		if err == nil && len(views) < *services {
			err = fmt.Errorf("explain read %d views, want %d", len(views), *services)
		}
		return err
	})
	r.ExplainCPU = lastCPU
	phase("explain")
	r.List = timed(func() error {
		cmd := exec.Command(list[0], list[1:]...)
		out, err := cmd.Output()
		r.RulesetBytes = len(out)
		return err
	})
	r.ListCPU = lastCPU
	if *count {
		r.Counts = timed(func() error {
			counts, err := p.Counts()
			if err == nil && len(counts) < *services**endpoints {
				err = fmt.Errorf("read %d endpoint counts, want %d", len(counts), *services**endpoints)
			}
			return err
		})
		r.CountsCPU = lastCPU
	}
	r.LoadAvg = runinfo.LoadAvg()
	if err := p.Cleanup(); err != nil {
		fail(err)
	}
	printResult(r)
}

// printResult prints r as one JSON line, with the peak RSS so far.
func printResult(r point.Result) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		r.RSSMiB = float64(ru.Maxrss) / 1024
	}
	if r.LoadAvg == "" {
		r.LoadAvg = runinfo.LoadAvg()
	}
	r.Commit, r.Date = runinfo.Commit(), runinfo.Date()
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fail(err)
	}
}

// startProfiles starts the CPU profile and perf's recording (either may be
// off) and returns the function that stops both: so a profile holds the
// partial syncs only, not the first sync that dwarfs them.
func startProfiles(cpuFile, perfCtl string) func() {
	var stops []func()
	if cpuFile != "" {
		f, err := os.Create(cpuFile)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		stops = append(stops, func() { pprof.StopCPUProfile(); _ = f.Close() })
	}
	if perfCtl != "" {
		f, err := os.OpenFile(perfCtl, os.O_WRONLY, 0)
		if err != nil {
			fail(err)
		}
		if _, err := f.WriteString("enable\n"); err != nil {
			fail(err)
		}
		stops = append(stops, func() { _, _ = f.WriteString("disable\n"); _ = f.Close() })
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// writeHeap writes the live heap (after a GC) to file, and its in-use
// figure to stderr.
func writeHeap(file string) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Fprintf(os.Stderr, "scale-bench: %s: heap in use %.1f MiB, sys %.1f MiB\n", file, float64(ms.HeapInuse)/(1<<20), float64(ms.Sys)/(1<<20))
	f, err := os.Create(file)
	if err != nil {
		fail(err)
	}
	defer f.Close()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fail(err)
	}
}

// makeState builds n Services with m endpoints each (weights 1..4). VIPs
// come from 198.18.0.0/16, endpoints from 198.19.0.0/16 (ports vary once
// the addresses run out).
func makeState(n, m int) dataplane.State {
	var s dataplane.State
	for i := 0; i < n; i++ {
		vip := [4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}
		sp := dataplane.ServicePort{
			Name: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http"},
			VIP:  dataplane.VIP{IP: netip.AddrFrom4(vip), Port: 80, Protocol: dataplane.TCP},
		}
		for j := 0; j < m; j++ {
			k := i*m + j
			ip := [4]byte{198, 19, byte((k % 65000) >> 8), byte(k % 65000)}
			sp.Backends = append(sp.Backends, dataplane.Backend{
				IP: netip.AddrFrom4(ip), Port: uint16(8080 + k/65000), Weight: float64(1 + j%4), Ready: true, Serving: true,
			})
		}
		s.Services = append(s.Services, sp)
	}
	s.Sort()
	return s
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale-bench:", err)
	os.Exit(1)
}
