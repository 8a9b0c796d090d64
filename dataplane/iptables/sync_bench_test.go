package iptables

import (
	"testing"

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
