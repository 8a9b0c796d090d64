//go:build e2e

package iptables

// A kernel benchmark (root; -tags e2e): partial syncs at 1,000 Services x
// 100 endpoints against iptables-legacy in a network namespace of its own
// (inNetns), one endpoint's address changed per sync as in bench-k8s.
// Besides wall time per sync it reports the CPU-seconds of steelyard
// itself and of its children (iptables-restore, the canary's iptables -C),
// which the load of a shared machine does not inflate as it does wall
// time. Each run (the framework's first with b.N = 1, then the one asked)
// pays for a full sync first: 10-45 s of iptables-legacy-restore.
//
//	go test -tags e2e -run XXX -bench KernelSyncPartial -benchtime 10x ./dataplane/iptables/
//
// Test IP plan: benchState's (VIPs 198.18.0.1 .., endpoints in
// 198.19.0.0/16); the changing endpoint takes 198.19.254.0 or .1.

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
)

func BenchmarkKernelSyncPartial1kx100(b *testing.B) {
	// A lock file of its own: the namespace is private, and a full restore
	// holding the host's /run/xtables.lock for 10-45 s made other tests'
	// iptables calls (--wait 5) fail meanwhile.
	b.Setenv("XTABLES_LOCKFILE", filepath.Join(b.TempDir(), "xtables.lock"))
	err := inNetns(func() error {
		ipt, _, err := New(ModeLegacy)
		if err != nil {
			return err
		}
		p := NewProxier(ipt, testCfg)
		s := benchState(1000, 100)
		if _, err := p.Sync(s, dataplane.FullSync); err != nil {
			return err
		}
		// No Cleanup: the namespace goes with the thread.
		svc := s.Services[500].Name.Service()
		req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{svc: true}}
		var restore time.Duration
		self0, children0 := cpuSeconds()
		b.ResetTimer()
		for i := range b.N {
			s.Services[500].Backends[7].IP = netip.AddrFrom4([4]byte{198, 19, 254, byte(i % 2)})
			if _, err := p.Sync(s, req); err != nil {
				return err
			}
			if p.LastSync.Full || p.LastSync.ChainsWritten != 2 || p.LastSync.ChainsDeleted != 1 {
				return fmt.Errorf("sync %d: %+v", i, p.LastSync)
			}
			restore += p.LastSync.Restore
		}
		b.StopTimer()
		self1, children1 := cpuSeconds()
		b.ReportMetric((self1-self0)/float64(b.N), "steelyard-cpu-s/op")
		b.ReportMetric((children1-children0)/float64(b.N), "iptables-cpu-s/op")
		b.ReportMetric(restore.Seconds()/float64(b.N), "restore-s/op")
		b.ReportMetric(float64(p.LastSync.RestoreBytes), "restore-bytes")
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
