package controller

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// benchSource is 10,000 Services x 10 endpoints (one slice each), the
// shape of bench-k8s's 10,000-Service point.
func benchSource(n int) *staticSource {
	src := &staticSource{}
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("svc-%d", i)
		src.svcs = append(src.svcs, makeService("bench", name, withIP(fmt.Sprintf("198.18.%d.%d", (i+1)>>8, (i+1)&0xff))))
		src.slices = append(src.slices, makeSlice("bench", name, name+"-a", benchEndpoints(name, i, ""), nil))
	}
	return src
}

// benchEndpoints are Service i's ten endpoints; unready names one that is
// not ready.
func benchEndpoints(name string, i int, unready string) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	for j := 0; j < 10; j++ {
		k := i*10 + j
		pod := fmt.Sprintf("%s-%d", name, j)
		cond := condReady
		if pod == unready {
			cond = condNotReady
		}
		eps = append(eps, endpoint(fmt.Sprintf("198.19.%d.%d", (k>>8)&0xff, k&0xff), pod, cond))
	}
	return eps
}

// BenchmarkAgentEndpointChange10kx10 is one endpoint change (an endpoint of
// one Service turns unready, then ready again) at 10,000 Services x 10
// endpoints, through the tracker and a partial sync, the dataplane left
// out: the agent's CPU time and allocations per change.
func BenchmarkAgentEndpointChange10kx10(b *testing.B) {
	src := benchSource(10000)
	tr := NewChangeTracker()
	a := &Agent{Source: src, Tracker: tr, Builder: NewBuilder(), Dataplane: &nopDataplane{}, FullSyncPeriod: time.Hour}
	if err := a.Sync(); err != nil {
		b.Fatal(err)
	}
	// Two versions of the slice of Service 4321, swapped on each change.
	const i = 4321
	name := fmt.Sprintf("svc-%d", i)
	versions := []*discoveryv1.EndpointSlice{
		src.slices[i],
		makeSlice("bench", name, name+"-a", benchEndpoints(name, i, name+"-3"), nil),
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for n := range b.N {
		prev, cur := versions[n%2], versions[(n+1)%2]
		src.slices[i] = cur
		tr.SliceChanged(prev, cur)
		if err := a.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0)
}

// cpuTime is the process's user plus system CPU time: on a loaded machine
// it says what a change costs where wall time says mostly how long it
// waited for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per iteration since cpu0 (GC included).
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}
