package nftables

import (
	"context"
	"syscall"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/dataplanetest"
)

// bigState returns n Service ports with 10 endpoints each (VIPs in
// 198.18.0.0/16, pods in 198.19.0.0/16).
func bigState(n int) dataplane.State { return dataplanetest.Synthetic(n, 10) }

// BenchmarkFirstSync renders 10,000 Services x 10 endpoints and runs the
// first (full) transaction against knftables.Fake.
func BenchmarkFirstSync(b *testing.B) {
	s := bigState(10000)
	for b.Loop() {
		p := NewProxier(knftables.NewFake(knftables.IPv4Family, TableName), testCfg)
		if _, err := p.Sync(s, dataplane.FullSync); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPartialSync changes one endpoint's weight of one Service out of
// 10,000 and runs the partial transaction.
func BenchmarkPartialSync(b *testing.B) {
	s := bigState(10000)
	p := NewProxier(knftables.NewFake(knftables.IPv4Family, TableName), testCfg)
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		s.Services[5000].Detach() // the Proxier's record shares the old ones
		s.Services[5000].Backends[3].Weight = float64(1 + i%2*7)
		i++
		if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
			b.Fatal(err)
		}
	}
}

// discardNFT builds transactions and throws them away: it measures
// steelyard's own rendering, without the Fake's bookkeeping.
type discardNFT struct {
	knftables.Interface
	ops int
}

func (d *discardNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	d.ops = tx.NumOperations()
	return nil
}

func (d *discardNFT) List(context.Context, string) ([]string, error) { return nil, nil }

// BenchmarkRenderFirst renders the first (full) transaction of 10,000
// Services x 10 endpoints, without running it.
func BenchmarkRenderFirst(b *testing.B) {
	s := bigState(10000)
	for b.Loop() {
		d := &discardNFT{Interface: knftables.NewFake(knftables.IPv4Family, TableName)}
		if _, err := NewProxier(d, testCfg).Sync(s, dataplane.FullSync); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(d.ops), "ops")
	}
}

// BenchmarkRenderPartial renders the partial transaction after one weight
// change among 10,000 Services, without running it.
func BenchmarkRenderPartial(b *testing.B) {
	s := bigState(10000)
	d := &discardNFT{Interface: knftables.NewFake(knftables.IPv4Family, TableName)}
	p := NewProxier(d, testCfg)
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		s.Services[5000].Detach() // the Proxier's record shares the old ones
		s.Services[5000].Backends[3].Weight = float64(1 + i%2*7)
		i++
		if _, err := p.Sync(s, dataplane.PartialSync); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(d.ops), "ops")
	}
}

// BenchmarkRenderChanged is BenchmarkRenderPartial with the tracker's
// changed set, as the agent passes it: steelyard's own share of a partial
// sync at 10,000 Services (the rest is the kernel's).
func BenchmarkRenderChanged(b *testing.B) {
	s := bigState(10000)
	s.Sort() // as the Builder hands it over
	d := &discardNFT{Interface: knftables.NewFake(knftables.IPv4Family, TableName)}
	p := NewProxier(d, testCfg)
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{s.Services[5000].Name.Service(): true}}
	i := 0
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for b.Loop() {
		s.Services[5000].Detach() // the Proxier's record shares the old ones
		s.Services[5000].Backends[3].Weight = float64(1 + i%2*7)
		i++
		if _, err := p.Sync(s, req); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time per sync: wall time means little on a shared machine.
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := func(r syscall.Rusage) float64 {
		return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
	}
	b.ReportMetric((cpu(ru1)-cpu(ru0))/float64(i)*1000, "cpu-ms/op")
}
