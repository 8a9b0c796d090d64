//go:build e2e

package nftables

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/dataplanetest"
)

// BenchmarkKernelChange is the kernel's side of issue 21's flat change
// latency, in a sandbox's node namespace: after a first sync of
// STEELYARD_CHANGE_SERVICES (10,000 when unset) x 10 endpoints,
// STEELYARD_CHANGE_COUNT (200) partial syncs each change one endpoint's
// weight of a Service spread over the table (its port's ranges all move),
// every one over netlink. It logs the CPU per change (user + system of
// the process: the kernel applies a netlink batch in the sender's
// sendmsg, so its commit is in the system time) and the p50/p99 of a
// sync's wall time. Then the two paths that still send elements through
// nft (which reads every plain interval map of the table first), with the
// CPU of nft included: five syncs of 40 Services changed at once (past
// maxNetlinkOps), and a restart's full sync (a new Proxier on the table,
// which flushes the shared maps it writes and puts every element back).
// STEELYARD_CHANGE_PERF names a file for "perf record -g" of the process
// during the single changes only.
func BenchmarkKernelChange(b *testing.B) {
	benchInSandbox(b, kernelChange, "STEELYARD_CHANGE_SERVICES", "STEELYARD_CHANGE_COUNT", "STEELYARD_CHANGE_PERF")
}

func kernelChange(t testing.TB) {
	count, changes := 10000, 200
	for k, v := range map[string]*int{"STEELYARD_CHANGE_SERVICES": &count, "STEELYARD_CHANGE_COUNT": &changes} {
		if s := os.Getenv(k); s != "" {
			if _, err := fmt.Sscan(s, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := dataplanetest.Synthetic(count, 10)
	s.Sort()
	p, err := NewKernel(testCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Cleanup() //nolint:errcheck
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	cpu := func() (user, sys float64) {
		var r syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r)
		return float64(r.Utime.Sec) + float64(r.Utime.Usec)/1e6, float64(r.Stime.Sec) + float64(r.Stime.Usec)/1e6
	}
	walls := make([]time.Duration, 0, changes)
	stopPerf := func() {}
	if out := os.Getenv("STEELYARD_CHANGE_PERF"); out != "" {
		rec := exec.Command("perf", "record", "-g", "-o", out, "-p", strconv.Itoa(os.Getpid()))
		if err := rec.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // attached
		stopPerf = func() {
			_ = rec.Process.Signal(syscall.SIGINT)
			_ = rec.Wait()
		}
	}
	u0, s0 := cpu()
	for i := range changes {
		sp := &s.Services[(i*7919)%len(s.Services)]
		sp.Detach() // the Proxier's record shares the old ones
		sp.Backends[3].Weight = float64(1 + (i/len(s.Services)+1)%2*7)
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sp.Name.Service(): true}}
		start := time.Now()
		if _, err := p.Sync(s, req); err != nil {
			t.Fatal(err)
		}
		walls = append(walls, time.Since(start))
		if !p.lastNetlink {
			t.Fatalf("change %d did not go over netlink", i)
		}
	}
	u1, s1 := cpu()
	stopPerf()
	all := func() float64 {
		var self, kids syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
		sec := func(tv syscall.Timeval) float64 { return float64(tv.Sec) + float64(tv.Usec)/1e6 }
		return sec(self.Utime) + sec(self.Stime) + sec(kids.Utime) + sec(kids.Stime)
	}
	const bulk, bulkSyncs = 40, 5
	c0, nftRuns := all(), 0
	for k := range bulkSyncs {
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}}
		for j := range bulk {
			sp := &s.Services[(k*bulk+j)*7907%len(s.Services)]
			sp.Detach()
			sp.Backends[2].Weight = float64(1 + (k+1)%2*4)
			req.Changed[sp.Name.Service()] = true
		}
		if _, err := p.Sync(s, req); err != nil {
			t.Fatal(err)
		}
		if !p.lastNetlink {
			nftRuns++
		}
	}
	bulkCPU := (all() - c0) / bulkSyncs
	c0 = all()
	p2, err := NewKernel(testCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	restartCPU := all() - c0
	t.Logf("%d x 10: a sync of %d Services changed at once %.3f CPU-s (nft included; %d of %d through nft), a restart's full sync %.2f CPU-s (%d operations in its last transaction, netlink %v)",
		count, bulk, bulkCPU, nftRuns, bulkSyncs, restartCPU, p2.lastOps, p2.lastNetlink)
	slices.Sort(walls)
	q := func(f float64) float64 { return walls[int(f*float64(len(walls)-1))].Seconds() * 1000 }
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%d changes at %d x 10: CPU per change %.2f ms (user %.2f, system %.2f), wall p50 %.2f ms, p99 %.2f ms; load %s",
		changes, count, (u1-u0+s1-s0)/float64(changes)*1000, (u1-u0)/float64(changes)*1000, (s1-s0)/float64(changes)*1000,
		q(0.5), q(0.99), strings.Join(strings.Fields(string(load))[:3], " "))
}
