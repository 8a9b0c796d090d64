package controller

import (
	"fmt"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// BenchmarkAgentChangeScale is BenchmarkAgentEndpointChange10kx10 at 1,000
// and 30,000 Services x 10, with the wall time of each change's sync (the
// dataplane left out) as p50-ms and p99-ms: what the agent spends before a
// dataplane sees a change, and how it grows with the cluster (issue 22's
// change -> map goal is 10 ms at 30,000, flat from 1,000).
func BenchmarkAgentChangeScale(b *testing.B) {
	for _, n := range []int{1000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			src := benchSource(n)
			tr := NewChangeTracker()
			a := &Agent{Source: src, Tracker: tr, Builder: NewBuilder(), Dataplane: &nopDataplane{}, FullSyncPeriod: time.Hour}
			if err := a.Sync(); err != nil {
				b.Fatal(err)
			}
			i := n / 2
			name := fmt.Sprintf("svc-%d", i)
			versions := []*discoveryv1.EndpointSlice{src.slices[i],
				makeSlice("bench", name, name+"-a", benchEndpoints(name, i, name+"-3"), nil)}
			var ds []time.Duration
			k := 0
			cpu0 := cpuTime()
			for b.Loop() {
				prev, cur := versions[k%2], versions[(k+1)%2]
				k++
				src.slices[i] = cur
				tr.SliceChanged(prev, cur)
				t0 := time.Now()
				if err := a.Sync(); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
			}
			reportCPU(b, cpu0)
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
