package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// runProxy measures one proxy configuration in a sandbox of its own.
func runProxy(ctx context.Context, cfg *config, cp *controlplane.ControlPlane, w *world, p proxy, n int) (r result) {
	r = result{proxy: p, services: n, endpoints: w.endpoints, changes: cfg.changes}
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
	var maps *ebpfMaps
	trafficCgroup := ""
	if p.name == proxySteelyardEBPF {
		// Set up before the agent starts, so undone after it stopped.
		env, err := setupEBPF()
		if err != nil {
			r.fail = err.Error()
			return r
		}
		defer env.close()
		p.cgroupPath, p.pinDir = env.cgroupPath, env.pinDir
		trafficCgroup = env.cgroup
		r.proxy = p
		maps = &ebpfMaps{pinDir: env.pinDir}
		defer maps.close()
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
			name := fmt.Sprintf("%s-%dx%d.log", p.id(), n, w.endpoints)
			if p.flavour != "" {
				name = fmt.Sprintf("%s-%s-%dx%d.log", p.id(), p.flavour, n, w.endpoints)
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
	var dump kernelScanner = p.kernelDump()
	if maps != nil {
		dump = maps
	}
	m := &monitor{agent: a, scraper: sc, dump: dump, maps: maps, ns: s.Node.Name}
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
	if cfg.traffic.at(n) && firstSize(cfg.sizes, n) == (size{n, w.endpoints}) && (p.nftTable() != "" || p.name == proxySteelyardEBPF) {
		// At the first size of n Services only (1000x10, not 1000x100),
		// and not in the iptables modes: after the phase deletes its
		// Service, kube-proxy's iptables mode keeps the stale endpoint
		// chains until a full sync (hourly), and the phase's wait for the
		// loaded count runs into its limit (2 min, seen at 300 Services).
		// The ebpf mode balances the sockets of its sub-cgroup's
		// processes: the client goes there (k8s-bench is in it too).
		r.traffic = runTraffic(ctx, cfg, s, w, m, p, n, trafficCgroup)
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
	var prof *perfProfile
	if p.steelyard() && slices.Contains(cfg.perfAt, n) && w.endpoints == firstSize(cfg.sizes, n).endpoints {
		prof = startPerf(cfg.logDir, fmt.Sprintf("%s-%dx%d", p.id(), n, w.endpoints), pid)
	}
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
		lat, err := m.waitProgrammed(cctx, cfg.changeTimeout, addr, w.vips[i], t0)
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
		// Every change made was measured; the budget ran out before the
		// rest were made (each change waits for the rules to be read
		// back, seconds at 1,000 x 100 in iptables mode): none was lost.
		r.changesErr = fmt.Sprintf("timeout (> %s for all changes; %d of %d made, each measured)", fmtLimit(cfg.changesTimeout), len(r.latencies), cfg.changes)
	}
	after, err := sc.scrape(ctx)
	if err == nil {
		r.netprog = after.histogram("network_programming_duration_seconds").minus(before.histogram("network_programming_duration_seconds"))
		r.partial = after.histogram("sync_partial_proxy_rules_duration_seconds").minus(before.histogram("sync_partial_proxy_rules_duration_seconds"))
	}
	if cpu, err := treeCPU(pid); err == nil {
		r.cpuChanges = cpu - cpu0
	}
	prof.stop(ctx)
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
	if cpu, err := treeCPU(pid); err == nil {
		r.cpuTotal = cpu
	}
	if exited, err := a.Exited(); exited {
		r.fail = fmt.Sprintf("exited during the run: %v", err)
		return r
	}
	if maps != nil {
		total, per, err := mapsMemlock(p.pinDir)
		if err != nil {
			logf("maps memlock: %v", err)
		} else {
			r.mapsMemlock = total
			logf("maps memlock: %d bytes in all: %v", total, per)
		}
	}
	// Last, with the proxy still running (as on a live node) but outside
	// its CPU and RSS: explain, or kube-proxy's nearest equivalent.
	if ctx.Err() == nil {
		r.explainWall, r.explainCPU, r.explainCmd, r.explainErr = timeExplain(ctx, cfg, s.Node.Name, p)
	}
	return r
}

// firstSize is the first of sizes with n Services.
func firstSize(sizes []size, n int) size {
	for _, s := range sizes {
		if s.services == n {
			return s
		}
	}
	return size{}
}
