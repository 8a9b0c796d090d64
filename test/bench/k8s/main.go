// Command k8s-bench compares steelyard with kube-proxy v1.37.2 against a
// real API server (scripts/bench-k8s.sh runs it; `make bench-k8s`). For
// each size N it starts etcd and kube-apiserver (test/controlplane), creates
// N Services with one EndpointSlice of -endpoints endpoints each, then runs
// every proxy configuration in turn, each in a network namespace of its own
// (test/sandbox) that reaches the API server through a relay, and measures:
//
//   - first full sync: from process start to the end of the first sync
//     after which the kernel holds a DNAT to every endpoint of every
//     Service (the end of each sync comes from the proxy's health endpoint;
//     the rules are read back after each one);
//   - endpoint-change latency: one endpoint of a random Service gets a new
//     address through the API (the slice stamped with
//     endpoints.kubernetes.io/last-change-trigger-time); the latency runs
//     from the write to the end of the first sync after which the new
//     address is in the kernel (read back with iptables-save), or, in
//     nftables modes, to the kernel's notification that added it (a
//     netlink listener in the namespace, nftListener);
//   - a quiet period after the changes (-idle): the proxy's syncs with
//     nothing changed, and what they wrote to the kernel;
//   - the proxy's own network-programming histogram over the same changes
//     (bucket bounds only), its partial-sync durations, CPU seconds of the
//     proxy and its children, and its peak RSS.
//
// It prints one table and asserts nothing. Every phase has a time limit; a
// phase that runs out shows as "timeout (> limit)". It needs root and
// touches nothing outside the namespaces it makes (and deletes).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/runinfo"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

type config struct {
	sizes          []size
	changes        int
	proxies        []proxy // in the order given; flavour and cgroup set per run
	flavours       []string
	nftMax         int
	iptablesMax    int
	loadMethod     string
	runID          string
	commit         string // read once at the start: the checkout may move during a run
	explainTimeout time.Duration
	perfAt         []int
	bins           binaries
	loadWorkers    int
	loadTimeout    time.Duration
	syncTimeout    time.Duration
	changeTimeout  time.Duration
	changesTimeout time.Duration
	gap            time.Duration
	settle         time.Duration
	seed           uint64
	verbose        bool
	logDir         string
	points         string
	idle           time.Duration
	compareMonitor bool
	traffic        trafficConfig
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == trafficClientCmd {
		os.Exit(trafficClient(os.Stdin, os.Stdout))
	}
	var (
		cfg       config
		services  = flag.String("services", "1000,10000", "comma-separated sizes, one control plane each: a Service count, with its endpoints per Service after an x (1000x100; else -endpoints)")
		proxies   = flag.String("proxies", defaultProxies, "proxies to run: steelyard (iptables), kube-proxy-iptables, steelyard-nftables, steelyard-ebpf, kube-proxy-nftables; a -msp<duration> suffix sets its --min-sync-period (kube-proxy-nftables-msp250ms)")
		flavours  = flag.String("iptables-mode", "legacy", "iptables flavours for steelyard and kube-proxy's iptables mode: legacy, nft or both")
		endpoints = flag.Int("endpoints", 10, "endpoints per Service of a size without its own")
	)
	flag.IntVar(&cfg.iptablesMax, "iptables-max-services", 1000, "run the iptables modes (steelyard, kube-proxy-iptables) only up to this many Services; 0: no limit")
	flag.StringVar(&cfg.loadMethod, "load", "etcd", "how the objects are created: etcd (written into etcd as kube-apiserver stores them, seed.go: seconds at 30,000 Services) or api (created through the API: its ClusterIP allocator makes that quadratic)")
	flag.StringVar(&cfg.runID, "run-id", "", "the run's id in its points (default: its start time, UTC, and the commit)")
	perfAt := flag.String("perf-at", "", "Service counts at which steelyard's CPU is sampled with perf record during the changes (the first size of each count; needs -log-dir, where the data and the report go)")
	flag.DurationVar(&cfg.explainTimeout, "explain-timeout", 5*time.Minute, "limit for one explain (or, for kube-proxy, one ruleset listing)")
	flag.IntVar(&cfg.changes, "changes", 100, "endpoint changes per proxy")
	flag.IntVar(&cfg.nftMax, "nft-max-services", 1000, "run the nft flavour only up to this many Services (iptables-nft-restore slows down with jumps x chains); 0: no limit")
	flag.StringVar(&cfg.bins.steelyard, "steelyard", "bin/steelyard", "steelyard binary")
	flag.IntVar(&cfg.loadWorkers, "load-workers", 16, "parallel API clients creating the objects")
	flag.DurationVar(&cfg.loadTimeout, "load-timeout", 20*time.Minute, "limit for creating the objects")
	flag.DurationVar(&cfg.syncTimeout, "sync-timeout", 10*time.Minute, "limit for the first full sync")
	flag.DurationVar(&cfg.changeTimeout, "change-timeout", 2*time.Minute, "limit for one endpoint change to reach the kernel")
	flag.DurationVar(&cfg.changesTimeout, "changes-timeout", 20*time.Minute, "limit for all endpoint changes of one proxy")
	flag.DurationVar(&cfg.gap, "change-gap", 2*time.Second, "pause before each change: random, uniform in [0, this)")
	flag.DurationVar(&cfg.settle, "settle", 5*time.Second, "pause after the first sync and between proxies")
	flag.Uint64Var(&cfg.seed, "seed", 1, "seed of the random Service, endpoint and pause choices (the same for every proxy)")
	flag.DurationVar(&cfg.idle, "idle", 65*time.Second, "after the changes, measure the syncs of this long a quiet period (periodic syncs with nothing changed); 0: skip")
	flag.BoolVar(&cfg.compareMonitor, "compare-nft-monitor", false, "nftables modes: also time each change with `nft monitor` (the old method; not live within minutes at 10,000 Services) and log both")
	flag.BoolVar(&cfg.verbose, "v", false, "log every step (namespaces, control plane, each change) to stderr")
	flag.StringVar(&cfg.logDir, "log-dir", "", "copy each proxy's log into this directory")
	flag.StringVar(&cfg.points, "points", "", "append each measured proxy as a JSON line of scale-plot's points to this file (docs/bench-k8s.jsonl: drawn beside the dataplanes' growth)")
	registerTrafficFlags(&cfg.traffic)
	flag.Parse()

	var err error
	if cfg.sizes, err = parseSizes(*services, *endpoints); err != nil {
		fail(fmt.Errorf("-services: %w", err))
	}
	for _, name := range splitList(*proxies) {
		base, msp, err := minSyncOf(name)
		if err != nil {
			fail(fmt.Errorf("-proxies: %w", err))
		}
		if !knownProxy(base) {
			fail(fmt.Errorf("-proxies: unknown proxy %q", name))
		}
		cfg.proxies = append(cfg.proxies, proxy{name: base, minSync: msp})
	}
	if *perfAt != "" {
		if cfg.perfAt, err = parseInts(*perfAt); err != nil {
			fail(fmt.Errorf("-perf-at: %w", err))
		}
	}
	if cfg.loadMethod != "etcd" && cfg.loadMethod != "api" {
		fail(fmt.Errorf("-load: %q: want etcd or api", cfg.loadMethod))
	}
	cfg.commit = runinfo.Commit()
	if cfg.runID == "" {
		cfg.runID = time.Now().UTC().Format("20060102T150405Z") + "-" + cfg.commit
	}
	cfg.flavours = splitList(*flavours)
	for _, f := range cfg.flavours {
		if f != "legacy" && f != "nft" {
			fail(fmt.Errorf("-iptables-mode: %q: want legacy or nft", f))
		}
	}
	if cfg.changes < 0 || cfg.loadWorkers < 1 {
		fail(fmt.Errorf("-changes >= 0, -load-workers >= 1"))
	}
	if !sandbox.IsRoot() {
		fail(fmt.Errorf("needs root (network namespaces, iptables): run scripts/bench-k8s.sh or use sudo"))
	}
	if cfg.bins.steelyard, err = filepath.Abs(cfg.bins.steelyard); err != nil {
		fail(err)
	}
	if slices.ContainsFunc(cfg.proxies, proxy.steelyard) {
		if _, err := os.Stat(cfg.bins.steelyard); err != nil {
			fail(fmt.Errorf("steelyard binary: %w (run `make build`)", err))
		}
	}
	bins, err := controlplane.FindBinaries()
	if err != nil {
		fail(err)
	}
	cfg.bins.kubeProxy = bins.KubeProxy

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	handleSignals(cancel)

	started := time.Now()
	load0 := loadAvg()
	logf("run %s: sizes %v, %d changes per proxy", cfg.runID, cfg.sizes, cfg.changes)
	var results []result
	for _, sz := range cfg.sizes {
		if ctx.Err() != nil {
			break
		}
		rs, err := benchSize(ctx, &cfg, sz, bins)
		results = append(results, rs...)
		if err != nil {
			logf("N=%s: %v", sz, err)
			results = append(results, result{services: sz.services, endpoints: sz.endpoints, fail: err.Error()})
		}
	}
	printTable(os.Stdout, &cfg, results, load0, loadAvg(), time.Since(started))
	printTraffic(os.Stdout, results)
	if ctx.Err() != nil {
		os.Exit(130)
	}
}

// defaultProxies: steelyard's three modes beside kube-proxy, kube-proxy's
// nftables mode at its own default --min-sync-period (1 s) and at
// steelyard's (250 ms).
const defaultProxies = "steelyard,kube-proxy-iptables,steelyard-nftables,steelyard-ebpf,kube-proxy-nftables,kube-proxy-nftables-msp250ms"

// benchSize runs every proxy configuration against one control plane
// loaded with sz.
func benchSize(ctx context.Context, cfg *config, sz size, bins controlplane.Binaries) ([]result, error) {
	n := sz.services
	vlog := func(string, ...any) {}
	if cfg.verbose {
		vlog = logf
	}
	logf("N=%d: starting etcd and kube-apiserver", n)
	cp, err := controlplane.StartProcess(ctx, controlplane.Options{Binaries: bins, ReducedAPIs: true, ReadyTimeout: 2 * time.Minute, Logf: vlog})
	if err != nil {
		return nil, err
	}
	untrack := track(cp)
	defer func() {
		untrack()
		if err := cp.Stop(); err != nil {
			logf("control plane stop: %v", err)
		}
	}()
	lctx, cancel := context.WithTimeout(ctx, cfg.loadTimeout)
	w, err := load(lctx, cp, n, sz.endpoints, cfg.loadWorkers, cfg.loadMethod, logf)
	cancel()
	if err != nil {
		if lctx.Err() == context.DeadlineExceeded {
			return nil, fmt.Errorf("loading the API server: timeout (> %s)", fmtLimit(cfg.loadTimeout))
		}
		return nil, fmt.Errorf("loading the API server: %w", err)
	}

	var runs []proxy
	for _, p := range cfg.proxies {
		if p.name != proxySteelyard && p.name != proxyKubeProxyIPTables {
			runs = append(runs, p)
			continue
		}
		if cfg.iptablesMax > 0 && n > cfg.iptablesMax {
			logf("N=%s: skipping %s (-iptables-max-services %d)", sz, p.id(), cfg.iptablesMax)
			continue
		}
		for _, fl := range cfg.flavours {
			if fl == "nft" && cfg.nftMax > 0 && n > cfg.nftMax {
				logf("N=%s: skipping the nft flavour (-nft-max-services %d)", sz, cfg.nftMax)
				continue
			}
			p.flavour = fl
			runs = append(runs, p)
		}
	}
	var results []result
	for k, p := range runs {
		if ctx.Err() != nil {
			break
		}
		if k > 0 && !sleep(ctx, cfg.settle) {
			break
		}
		logf("N=%s: %s (%s)", sz, p.label(), p.flavourLabel())
		r := runProxy(ctx, cfg, cp, w, p, n)
		r.loadTime = w.loadTime
		logf("N=%s: %s (%s): %s", sz, p.label(), p.flavourLabel(), r.summary())
		if err := appendPoint(cfg.points, cfg, r); err != nil {
			logf("-points: %v", err)
		}
		results = append(results, r)
	}
	return results, nil
}

// result is one row of the table.
type result struct {
	proxy     proxy
	services  int
	endpoints int
	fail      string // the run could not be measured (start failure, crash)
	loadTime  time.Duration

	// After the run: explain (kube-proxy: its ruleset listed), wall and
	// CPU seconds, the command timed; the ebpf mode's map memory.
	explainWall, explainCPU float64
	explainCmd, explainErr  string
	mapsMemlock             uint64
	cpuTotal                float64 // CPU seconds from start to the end of the run

	firstSync    time.Duration
	firstSyncErr string // "timeout (> 10m)", ...

	latencies  []time.Duration
	changesErr string // why fewer than the requested changes were measured
	changes    int    // requested

	netprog      histogram // network programming, over the changes
	partial      histogram // partial syncs, over the changes
	cpuSync      float64   // CPU seconds up to the first full sync
	cpuChanges   float64   // CPU seconds during the changes
	rssKiB       int64
	cpuMeasured  bool
	syncMeasured bool

	// nftables modes: the kernel-event listener over the changes, and
	// with -compare-nft-monitor nft monitor's time minus the listener's
	// for each change.
	events      listenerStats
	eventsOK    bool
	monitorDiff []time.Duration

	// The quiet period after the changes (-idle): the proxy's syncs and,
	// in nftables modes, the kernel transactions and messages.
	idle       time.Duration
	idleSyncs  histogram
	idleEvents listenerStats

	traffic *trafficResult // the traffic phase (traffic.go), nil when not run
}

func (r result) summary() string {
	if r.fail != "" {
		return "failed: " + r.fail
	}
	s := fmt.Sprintf("first sync %s, change p50 %s p99 %s (%d), CPU %.1f+%.1f s (total %.1f), peak RSS %d MiB, explain %.2f s (%.2f CPU-s, %s)",
		r.firstSyncCell(), r.latencyCell(0.5), r.latencyCell(0.99), len(r.latencies), r.cpuSync, r.cpuChanges, r.cpuTotal, r.rssKiB/1024,
		r.explainWall, r.explainCPU, r.explainCmd)
	if r.explainErr != "" {
		s += " explain error: " + r.explainErr
	}
	if r.mapsMemlock > 0 {
		s += fmt.Sprintf(", maps memlock %.1f MiB", float64(r.mapsMemlock)/(1<<20))
	}
	return s
}
