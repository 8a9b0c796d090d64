package iptables

import (
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
)

// savedKernel is a kernel for benchmarks: SaveAll returns fixed text and
// Restore discards its input, so only steelyard's own work is measured
// (not the fake's bookkeeping, not iptables).
type savedKernel struct {
	Fake
	saved []byte
}

func (k *savedKernel) SaveAll() ([]byte, error) { return k.saved, nil }
func (k *savedKernel) Restore([]byte) error     { return nil }
func (k *savedKernel) HasRule(Table, Chain, ...string) (bool, error) {
	return true, nil
}

// syncedProxier returns a Proxier that has applied benchState(n, m) and a
// kernel that saves exactly those rules.
func syncedProxier(b *testing.B, n, m int) (*Proxier, *savedKernel) {
	b.Helper()
	f := NewFake()
	s := benchState(n, m)
	if _, err := NewProxier(f, testCfg).Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	saved, _ := f.SaveAll()
	k := &savedKernel{Fake: *NewFake(), saved: saved}
	p := NewProxier(k, testCfg)
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	return p, k
}

// BenchmarkSyncPartial10kx10 is a periodic or change-driven sync at 10,000
// Services: render (reusing unchanged fragments), diff, one restore text.
func BenchmarkSyncPartial10kx10(b *testing.B) {
	p, _ := syncedProxier(b, 10000, 10)
	s := benchState(10000, 10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		s.Services[5000].Detach() // the record shares the old ones
		s.Services[5000].Backends[0].Weight = float64(2 + i%2)
		if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSyncFullNoChange10kx10 is a full resync at 10,000 Services over
// an intact kernel: parse iptables-save, compare, write nothing.
func BenchmarkSyncFullNoChange10kx10(b *testing.B) {
	p, _ := syncedProxier(b, 10000, 10)
	s := benchState(10000, 10)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := p.Sync(s, dataplane.FullSync); err != nil {
			b.Fatal(err)
		}
		if p.LastSync.ChainsWritten != 0 {
			b.Fatalf("wrote %d chains", p.LastSync.ChainsWritten)
		}
	}
}

// BenchmarkSyncPartial1kx100 is BenchmarkSyncPartial10kx10 at 1,000
// Services x 100 endpoints (the bench-k8s size where the iptables mode
// fell behind kube-proxy): one endpoint's address changes per sync, as in
// bench-k8s, so one Service chain is rewritten, one endpoint chain added
// and one deleted.
func BenchmarkSyncPartial1kx100(b *testing.B) {
	p, _ := syncedProxier(b, 1000, 100)
	s := benchState(1000, 100)
	svc := s.Services[500].Name.Service()
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{svc: true}}
	b.ReportAllocs()
	self0, _ := cpuSeconds()
	b.ResetTimer()
	for i := range b.N {
		s.Services[500].Backends[7].IP = netip.AddrFrom4([4]byte{198, 19, 254, byte(i % 2)})
		if _, err := p.Sync(s, req); err != nil {
			b.Fatal(err)
		}
		if p.LastSync.Full || p.LastSync.ChainsWritten != 2 || p.LastSync.ChainsDeleted != 1 {
			b.Fatalf("sync %d: %+v", i, p.LastSync)
		}
	}
	b.StopTimer()
	// CPU time (the garbage collector's included) is what a loaded
	// machine does not inflate the way it does wall time.
	self1, _ := cpuSeconds()
	b.ReportMetric((self1-self0)/float64(b.N), "cpu-s/op")
}

// cpuSeconds returns the user+system CPU time of this process (self) and
// of its waited-for children.
func cpuSeconds() (self, children float64) {
	sec := func(who int) float64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return 0
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return sec(syscall.RUSAGE_SELF), sec(syscall.RUSAGE_CHILDREN)
}
