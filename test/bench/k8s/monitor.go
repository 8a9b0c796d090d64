package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// monitor watches one proxy: the time of its last sync, and its rules in
// the kernel.
type monitor struct {
	agent   *sandbox.Agent
	scraper *scraper
	dump    kernelScanner
	ns      string
	// maps, in the ebpf mode, gives the time each address reached the
	// socket programs' maps (waitMap).
	maps  *ebpfMaps
	trace func(string, ...any) // -v: each step of waitProgrammed
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
//
// In the ebpf mode the latency is from t0 to the first poll of the
// changed port's map entries (1 ms period) that finds want.
func (m *monitor) waitProgrammed(ctx context.Context, limit time.Duration, want string, vip netip.Addr, t0 time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if m.maps != nil {
		tc, err := m.maps.waitMap(ctx, vip, want)
		if err != nil {
			return 0, err
		}
		return tc.Sub(t0), nil
	}
	if m.watch != nil {
		tc, err := m.watch.wait(ctx, want)
		if errors.Is(err, errStopped) {
			// Measured by reading the rules back from now on (slower
			// to read, and the latency may then be overstated).
			logf("%v: reading the rules back after each sync instead", err)
			m.watch = nil
			return m.waitProgrammed(ctx, limit, want, vip, t0)
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

// kernelScanner reads a proxy's rules or maps back: the number of DNAT
// destinations (map backends) in the pod range, and whether want is one.
type kernelScanner interface {
	scan(ctx context.Context, ns, want string) (count int, found bool, err error)
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
