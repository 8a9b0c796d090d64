//go:build e2e

package nftables

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/dataplanetest"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// BenchmarkKernelFirstSync is the first sync of STEELYARD_FIRSTSYNC_SERVICES
// (default 10000) Service ports x 10 endpoints into an empty table of a
// test namespace's kernel: wall time, and the CPU split into user and
// system (the kernel's work on the netlink batches is charged to the
// sending thread), children (nft) included. STEELYARD_FIRSTSYNC_CPUPROFILE
// writes a CPU profile of the sync. STEELYARD_FIRSTSYNC_BATCH sets
// BatchPorts. Figures only:
//
//	go test -tags e2e -run '^$' -bench KernelFirstSync -benchtime 1x ./dataplane/nftables/
func BenchmarkKernelFirstSync(b *testing.B) {
	if os.Getenv("STEELYARD_NLX_CHILD") != "" {
		kernelFirstSync(b)
		return
	}
	s := sandbox.NewT(b, sandbox.Options{})
	sandbox.ExecTimeout = 30 * time.Minute
	args := []string{"env", "STEELYARD_NLX_CHILD=1"}
	for _, k := range []string{"STEELYARD_FIRSTSYNC_SERVICES", "STEELYARD_FIRSTSYNC_CPUPROFILE", "STEELYARD_FIRSTSYNC_BATCH"} {
		args = append(args, k+"="+os.Getenv(k))
	}
	out, err := s.Node.Exec(append(args, os.Args[0], "-test.run", "^$", "-test.bench", "^BenchmarkKernelFirstSync$",
		"-test.benchtime", "1x", "-test.v", "-test.timeout", "30m")...)
	b.Logf("in %s:\n%s", s.Node.Name, out)
	if err != nil {
		b.Fatal(err)
	}
}

func kernelFirstSync(t testing.TB) {
	count, batch := 10000, 0
	for k, v := range map[string]*int{"STEELYARD_FIRSTSYNC_SERVICES": &count, "STEELYARD_FIRSTSYNC_BATCH": &batch} {
		if s := os.Getenv(k); s != "" {
			if _, err := fmt.Sscan(s, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if batch > 0 {
		BatchPorts = batch
	}
	s := dataplanetest.Synthetic(count, 10)
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
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	usage := func() (user, sys float64) {
		var self, kids syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
		sec := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
		return sec(self.Utime) + sec(kids.Utime), sec(self.Stime) + sec(kids.Stime)
	}
	u0, s0 := usage()
	start := time.Now()
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	u1, s1 := usage()
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("first sync of %d x 10 (BatchPorts %d, netlink %v): wall %.2f s, CPU user %.2f s, system %.2f s; load %s",
		count, BatchPorts, p.lastNetlink, wall.Seconds(), u1-u0, s1-s0, strings.Join(strings.Fields(string(load))[:3], " "))
}
