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
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

type config struct {
	services       []int
	endpoints      int
	changes        int
	proxies        []string
	flavours       []string
	nftMax         int
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
		cfg      config
		services = flag.String("services", "1000,10000", "comma-separated Service counts, one control plane each")
		proxies  = flag.String("proxies", "steelyard,kube-proxy-iptables,steelyard-nftables,kube-proxy-nftables", "proxies to run: steelyard, kube-proxy-iptables, steelyard-nftables, kube-proxy-nftables")
		flavours = flag.String("iptables-mode", "legacy,nft", "iptables flavours for steelyard and kube-proxy's iptables mode: legacy, nft or both")
	)
	flag.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per Service")
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
	if cfg.services, err = parseInts(*services); err != nil {
		fail(fmt.Errorf("-services: %w", err))
	}
	cfg.proxies = splitList(*proxies)
	for _, p := range cfg.proxies {
		if p != proxySteelyard && p != proxyKubeProxyIPTables && p != proxyKubeProxyNFTables && p != proxySteelyardNFTables {
			fail(fmt.Errorf("-proxies: unknown proxy %q", p))
		}
	}
	cfg.flavours = splitList(*flavours)
	for _, f := range cfg.flavours {
		if f != "legacy" && f != "nft" {
			fail(fmt.Errorf("-iptables-mode: %q: want legacy or nft", f))
		}
	}
	if cfg.endpoints < 1 || cfg.endpoints > 100 || cfg.changes < 0 || cfg.loadWorkers < 1 {
		fail(fmt.Errorf("-endpoints 1-100, -changes >= 0, -load-workers >= 1"))
	}
	if !sandbox.IsRoot() {
		fail(fmt.Errorf("needs root (network namespaces, iptables): run scripts/bench-k8s.sh or use sudo"))
	}
	if cfg.bins.steelyard, err = filepath.Abs(cfg.bins.steelyard); err != nil {
		fail(err)
	}
	if slices.Contains(cfg.proxies, proxySteelyard) || slices.Contains(cfg.proxies, proxySteelyardNFTables) {
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
	var results []result
	for _, n := range cfg.services {
		if ctx.Err() != nil {
			break
		}
		rs, err := benchSize(ctx, &cfg, n, bins)
		results = append(results, rs...)
		if err != nil {
			logf("N=%d: %v", n, err)
			results = append(results, result{services: n, fail: err.Error()})
		}
	}
	printTable(os.Stdout, &cfg, results, load0, loadAvg(), time.Since(started))
	printTraffic(os.Stdout, results)
	if ctx.Err() != nil {
		os.Exit(130)
	}
}

// benchSize runs every proxy configuration against one control plane
// loaded with n Services.
func benchSize(ctx context.Context, cfg *config, n int, bins controlplane.Binaries) ([]result, error) {
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
	w, err := load(lctx, cp, n, cfg.endpoints, cfg.loadWorkers, logf)
	cancel()
	if err != nil {
		if lctx.Err() == context.DeadlineExceeded {
			return nil, fmt.Errorf("loading the API server: timeout (> %s)", fmtLimit(cfg.loadTimeout))
		}
		return nil, fmt.Errorf("loading the API server: %w", err)
	}

	var runs []proxy
	for _, fl := range cfg.flavours {
		if fl == "nft" && cfg.nftMax > 0 && n > cfg.nftMax {
			logf("N=%d: skipping the nft flavour (-nft-max-services %d)", n, cfg.nftMax)
			continue
		}
		for _, name := range []string{proxySteelyard, proxyKubeProxyIPTables} {
			if slices.Contains(cfg.proxies, name) {
				runs = append(runs, proxy{name: name, flavour: fl})
			}
		}
	}
	for _, name := range []string{proxySteelyardNFTables, proxyKubeProxyNFTables} {
		if slices.Contains(cfg.proxies, name) {
			runs = append(runs, proxy{name: name})
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
		logf("N=%d: %s (%s)", n, p.label(), p.flavourLabel())
		r := runProxy(ctx, cfg, cp, w, p, n)
		logf("N=%d: %s (%s): %s", n, p.label(), p.flavourLabel(), r.summary())
		if err := appendPoint(cfg.points, cfg, r); err != nil {
			logf("-points: %v", err)
		}
		results = append(results, r)
	}
	return results, nil
}

// result is one row of the table.
type result struct {
	proxy    proxy
	services int
	fail     string // the run could not be measured (start failure, crash)

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
	return fmt.Sprintf("first sync %s, change p50 %s p99 %s, CPU %.1f+%.1f s, peak RSS %d MiB",
		r.firstSyncCell(), r.latencyCell(0.5), r.latencyCell(0.99), r.cpuSync, r.cpuChanges, r.rssKiB/1024)
}

// runProxy measures one proxy configuration in a sandbox of its own.
func runProxy(ctx context.Context, cfg *config, cp *controlplane.ControlPlane, w *world, p proxy, n int) (r result) {
	r = result{proxy: p, services: n, changes: cfg.changes}
	vlog := func(string, ...any) {}
	if cfg.verbose {
		vlog = logf
	}
	s, err := sandbox.New(sandbox.Options{Prefix: "sykb", Logf: vlog})
	if err != nil {
		r.fail = err.Error()
		return r
	}
	defer s.Close()
	api, err := netip.ParseAddrPort(strings.TrimPrefix(cp.URL, "https://"))
	if err != nil {
		r.fail = err.Error()
		return r
	}
	// The admin kubeconfig names https://127.0.0.1:<port>: the same
	// address inside the namespace leads to the API server.
	stopForward, err := s.Node.Forward(api, api.String())
	if err != nil {
		r.fail = err.Error()
		return r
	}
	defer stopForward()
	wrap := ""
	if p.name == proxyKubeProxyIPTables {
		if wrap, err = iptablesWrapDir(p.flavour); err != nil {
			r.fail = err.Error()
			return r
		}
		defer os.RemoveAll(wrap)
	}
	bin, args := p.command(cfg.bins, cp.Kubeconfig, wrap)
	start := time.Now()
	a, err := s.StartAgent(bin, args...)
	if err != nil {
		r.fail = err.Error()
		return r
	}
	defer func() {
		if r.fail != "" || r.firstSyncErr != "" || r.changesErr != "" {
			logf("%s log (%s), last lines:\n%s", p.label(), a.LogPath, lastLines(a.Log(), 25))
		}
		if cfg.logDir != "" {
			name := fmt.Sprintf("%s-%d.log", p.name, n)
			if p.flavour != "" {
				name = fmt.Sprintf("%s-%s-%d.log", p.name, p.flavour, n)
			}
			if err := os.WriteFile(filepath.Join(cfg.logDir, name), []byte(a.Log()), 0o644); err != nil {
				logf("saving the log: %v", err)
			}
		}
	}()
	// Runs before s.Close: stop the proxy, then kill whatever it left
	// running in its namespace (an iptables-restore cut off by a timeout
	// would otherwise go on for minutes after the namespace is deleted).
	defer func() {
		_ = a.Stop()
		killNamespace(s.Node.Name)
	}()
	pid := a.Pid()
	sc := newScraper(s.Node, p)
	defer sc.close()
	dump := p.kernelDump()
	m := &monitor{agent: a, scraper: sc, dump: dump, ns: s.Node.Name}
	if cfg.verbose {
		m.trace = logf
	}

	// Phase 1: the first full sync.
	sctx, cancel := context.WithTimeout(ctx, cfg.syncTimeout)
	ts, last, err := m.waitFirstSync(sctx, n*w.endpoints)
	cancel()
	r.cpuSync, _ = treeCPU(pid)
	r.rssKiB, _ = peakRSS(pid)
	r.cpuMeasured = true
	switch {
	case err == nil:
		r.firstSync = ts.Sub(start)
		r.syncMeasured = true
	case sctx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		r.firstSyncErr = fmt.Sprintf("timeout (> %s)", fmtLimit(cfg.syncTimeout))
		logf("first sync: timeout; last seen %d/%d DNAT rules", last, n*w.endpoints)
		return r
	default:
		r.fail = err.Error()
		return r
	}
	if !sleep(ctx, cfg.settle) {
		return r
	}
	if cfg.traffic.at(n) {
		r.traffic = runTraffic(ctx, cfg, s, w, m, p, n, "")
	}

	// Phase 2: endpoint changes, one at a time. In nftables mode the
	// kernel's own events say when each address arrived (nftListener).
	// The listener starts only now: the kernel builds no notification
	// while nobody listens (nfnetlink_has_listeners), so listening during
	// the first sync would add that work to the proxy's commit.
	var nl *nftListener
	if table := p.nftTable(); table != "" {
		if nl, err = startNFTListener(s.Node, table); err != nil {
			r.fail = err.Error()
			return r
		}
		defer nl.stop()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = nl.ready(rctx, s.Node.Name)
		cancel()
		if err != nil {
			r.fail = "kernel events: " + err.Error()
			return r
		}
		m.watch = nl
		if cfg.compareMonitor {
			nw, err := startNFTWatch(ctx, s.Node.Name, table)
			if err != nil {
				r.fail = err.Error()
				return r
			}
			defer nw.stop()
			t := time.Now()
			rctx, cancel := context.WithTimeout(ctx, cfg.syncTimeout)
			err = nw.ready(rctx, s.Node.Name)
			cancel()
			if err != nil {
				r.fail = "nft monitor: " + err.Error()
				return r
			}
			logf("nft monitor ready after %v", time.Since(t).Round(time.Millisecond))
			m.monitor = nw
			m.diffs = &r.monitorDiff
		}
	}
	var ev0 listenerStats
	if nl != nil {
		ev0 = nl.stats()
	}
	before, err := sc.scrape(ctx)
	if err != nil {
		r.fail = err.Error()
		return r
	}
	cpu0, _ := treeCPU(pid)
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(n)))
	cctx, cancel := context.WithTimeout(ctx, cfg.changesTimeout)
	defer cancel()
	for k := 0; k < cfg.changes; k++ {
		pause := time.Duration(rng.Int64N(int64(cfg.gap) + 1))
		i, j := rng.IntN(n), rng.IntN(w.endpoints)
		if !sleep(cctx, pause) {
			break
		}
		addr, err := w.changeAddr()
		if err != nil {
			r.changesErr = err.Error()
			break
		}
		t0, err := w.changeEndpoint(cctx, i, j, addr)
		if err != nil {
			if cctx.Err() == nil {
				r.changesErr = err.Error()
			}
			break
		}
		lat, err := m.waitProgrammed(cctx, cfg.changeTimeout, addr, t0)
		if err != nil {
			if err == context.DeadlineExceeded && cctx.Err() == nil {
				r.changesErr = fmt.Sprintf("timeout (> %s for one change)", fmtLimit(cfg.changeTimeout))
			} else if cctx.Err() == nil {
				r.changesErr = err.Error()
			}
			break
		}
		r.latencies = append(r.latencies, lat)
		if cfg.verbose {
			logf("change %d: svc-%d endpoint %d -> %s: %v", k+1, i, j, addr, lat.Round(time.Millisecond))
		}
	}
	switch {
	case len(r.latencies) == cfg.changes || r.changesErr != "":
	case ctx.Err() != nil:
		r.changesErr = "interrupted"
	default:
		r.changesErr = fmt.Sprintf("timeout (> %s for all changes)", fmtLimit(cfg.changesTimeout))
	}
	after, err := sc.scrape(ctx)
	if err == nil {
		r.netprog = after.histogram("network_programming_duration_seconds").minus(before.histogram("network_programming_duration_seconds"))
		r.partial = after.histogram("sync_partial_proxy_rules_duration_seconds").minus(before.histogram("sync_partial_proxy_rules_duration_seconds"))
	}
	if cpu, err := treeCPU(pid); err == nil {
		r.cpuChanges = cpu - cpu0
	}
	if nl != nil {
		r.events, r.eventsOK = nl.stats().minus(ev0), true
	}

	// Phase 3: a quiet period, nothing changed: what the periodic syncs
	// cost (the proxy's own sync histogram) and write (kernel events). It
	// starts -settle after the last change, past the end of that change's
	// sync (the kernel event comes before it) and steelyard's cleanup
	// sync a second later, which the first 10,000-Service run counted.
	if cfg.idle > 0 && ctx.Err() == nil && sleep(ctx, cfg.settle) {
		var i0 listenerStats
		if nl != nil {
			i0 = nl.stats()
		}
		t := time.Now()
		quiet0, err0 := sc.scrape(ctx)
		if err0 == nil && sleep(ctx, cfg.idle) {
			if idle, err := sc.scrape(ctx); err == nil {
				r.idle = time.Since(t)
				r.idleSyncs = idle.histogram("sync_proxy_rules_duration_seconds").minus(quiet0.histogram("sync_proxy_rules_duration_seconds"))
				if nl != nil {
					r.idleEvents = nl.stats().minus(i0)
				}
			}
		}
	}
	if rss, err := peakRSS(pid); err == nil {
		r.rssKiB = rss
	}
	if exited, err := a.Exited(); exited {
		r.fail = fmt.Sprintf("exited during the run: %v", err)
	}
	return r
}

// monitor watches one proxy: the time of its last sync, and its rules in
// the kernel.
type monitor struct {
	agent   *sandbox.Agent
	scraper *scraper
	dump    kernelDump
	ns      string
	trace   func(string, ...any) // -v: each step of waitProgrammed
	// watch, in nftables mode, gives the time each address reached the
	// kernel; without it (iptables) the rules are read back after each sync.
	watch *nftListener
	// monitor (-compare-nft-monitor) times each change again with nft
	// monitor; diffs collects its time minus watch's.
	monitor *nftWatch
	diffs   *[]time.Duration
}

func (m *monitor) exited() error {
	if done, err := m.agent.Exited(); done {
		return fmt.Errorf("the proxy exited: %v", err)
	}
	return nil
}

// waitFirstSync polls the time of the last sync; after each new sync it
// counts the DNAT destinations in the kernel, until there are want of
// them. It returns that sync's end time and the last count seen.
func (m *monitor) waitFirstSync(ctx context.Context, want int) (time.Time, int, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var checked time.Time
	last := 0
	for {
		if err := m.exited(); err != nil {
			return time.Time{}, last, err
		}
		if ts := m.scraper.lastSync(ctx); !ts.IsZero() && !ts.Equal(checked) {
			count, _, err := m.dump.scan(ctx, m.ns, "")
			if err != nil {
				if ctx.Err() != nil {
					return time.Time{}, last, ctx.Err()
				}
				return time.Time{}, last, err
			}
			last = count
			if count == want {
				return ts, count, nil
			}
			checked = ts
		}
		select {
		case <-ctx.Done():
			return time.Time{}, last, ctx.Err()
		case <-tick.C:
		}
	}
}

// waitProgrammed waits for a DNAT to want (an endpoint address) to be in the
// kernel: after each sync that ended after t0, it reads the rules back.
// The latency is the end of the first sync after which the rule was there,
// minus t0. When another sync ended while the rules were being read, that
// later sync is taken (the latency may then be over-, never under-stated).
//
// With a watch (nftables mode) the latency is instead from t0 to the
// kernel event that added want: the commit of the transaction, which is
// what reaching the kernel means; the proxy's sync end follows it.
func (m *monitor) waitProgrammed(ctx context.Context, limit time.Duration, want string, t0 time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if m.watch != nil {
		tc, err := m.watch.wait(ctx, want)
		if errors.Is(err, errStopped) {
			// Measured by reading the rules back from now on (slower
			// to read, and the latency may then be overstated).
			logf("%v: reading the rules back after each sync instead", err)
			m.watch = nil
			return m.waitProgrammed(ctx, limit, want, t0)
		}
		if err != nil {
			return 0, err
		}
		if m.trace != nil {
			m.trace("trace: in the kernel %v after the write; the proxy's last sync end then: %+v", tc.Sub(t0).Round(time.Millisecond), m.scraper.lastSync(ctx).Sub(t0).Round(time.Millisecond))
		}
		if m.monitor != nil {
			tm, err := m.monitor.wait(ctx, want)
			if err != nil {
				logf("nft monitor: %s: %v", want, err)
			} else {
				*m.diffs = append(*m.diffs, tm.Sub(tc))
				logf("change %s: kernel event %v after the write, nft monitor %v (%+v)", want, tc.Sub(t0).Round(time.Millisecond), tm.Sub(t0).Round(time.Millisecond), tm.Sub(tc).Round(time.Microsecond))
			}
		}
		return tc.Sub(t0), nil
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var checked time.Time
	for {
		if err := m.exited(); err != nil {
			return 0, err
		}
		if ts := m.scraper.lastSync(ctx); ts.After(t0) && !ts.Equal(checked) {
			s0 := time.Now()
			_, found, err := m.dump.scan(ctx, m.ns, want)
			if err != nil {
				if ctx.Err() != nil {
					return 0, ctx.Err()
				}
				return 0, err
			}
			if m.trace != nil {
				m.trace("trace: sync end %v after the write, scan at +%v took %v, found %v", ts.Sub(t0).Round(time.Millisecond), s0.Sub(t0).Round(time.Millisecond), time.Since(s0).Round(time.Millisecond), found)
			}
			if found {
				if ts2 := m.scraper.lastSync(ctx); ts2.After(ts) {
					if m.trace != nil {
						m.trace("trace: a later sync ended at +%v, during the scan", ts2.Sub(t0).Round(time.Millisecond))
					}
					ts = ts2
				}
				return ts.Sub(t0), nil
			}
			checked = ts
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

// killNamespace SIGKILLs every process in network namespace ns (all of
// them started by this benchmark: the namespace is its own).
func killNamespace(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Helpers.

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
	case d < 100*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.0fs", d.Seconds())
	}
}

func fmtSeconds(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return fmtDur(time.Duration(s * float64(time.Second)))
}

func fmtLimit(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if s == "" {
		return "0s"
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s k8s-bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "k8s-bench:", err)
	os.Exit(2)
}

// Cleanup on signals: the first SIGINT/SIGTERM cancels the run, which
// unwinds through the deferred Close/Stop calls and prints what was
// measured; a second signal, or 60 s without the unwinding finishing,
// closes every sandbox and control plane at once and exits.

var live struct {
	sync.Mutex
	cps map[*controlplane.ControlPlane]bool
}

func track(cp *controlplane.ControlPlane) (untrack func()) {
	live.Lock()
	if live.cps == nil {
		live.cps = map[*controlplane.ControlPlane]bool{}
	}
	live.cps[cp] = true
	live.Unlock()
	return func() {
		live.Lock()
		delete(live.cps, cp)
		live.Unlock()
	}
}

func handleSignals(cancel context.CancelFunc) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-ch
		logf("%v: stopping (again to force)", sig)
		cancel()
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
		}
		logf("forcing: removing the sandboxes and stopping the control plane")
		sandbox.CloseAll()
		live.Lock()
		for cp := range live.cps {
			_ = cp.Stop()
		}
		live.Unlock()
		os.Exit(130)
	}()
}
