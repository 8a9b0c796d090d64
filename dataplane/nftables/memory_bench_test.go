package nftables

import (
	"runtime"
	"runtime/debug"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/steelyard-net/steelyard/controller"
)

// BenchmarkMemoryFromAPI10kx10 is a node's first sync of 10,000 Services x
// 10 endpoints as steelyard run does it, for its memory: the API server's
// protobuf objects decoded one by one and stripped as the watch stores
// strip them (controller.StripUnread), kept as the stores keep them,
// handed to the ChangeTracker, then the agent's first Sync over the
// dual-stack nftables dataplane, at GOGC 50 (steelyard run's default).
// It reports the peak of Go's mapped, unreleased memory from the decoding
// on (what RSS follows), the live heap once the sync is done (after a
// GC) and, of it, what the stored objects take. The encoded objects (the
// input, not part of a node's memory) are subtracted from both.
func BenchmarkMemoryFromAPI10kx10(b *testing.B) {
	quietLogs(b)
	old := debug.SetGCPercent(50)
	defer debug.SetGCPercent(old)
	objs := newAPIObjects(b, 10000)
	for b.Loop() {
		debug.FreeOSMemory()
		input := liveHeap()
		stop := make(chan struct{})
		peak := make(chan uint64)
		go samplePeak(stop, peak)
		c := newFirstSyncBench(b)
		src := decodeStripped(b, objs, c.tr)
		close(stop)
		dp := <-peak
		stored := liveHeap()
		stop = make(chan struct{})
		go samplePeak(stop, peak)
		c.agent.Source = src
		if err := c.agent.Sync(); err != nil {
			b.Fatal(err)
		}
		close(stop)
		p := <-peak
		live := liveHeap()
		b.ReportMetric(float64(max(p, dp)-input)/(1<<20), "peak-MiB")
		b.ReportMetric(float64(dp-input)/(1<<20), "decode-peak-MiB")
		b.ReportMetric(float64(live-input)/(1<<20), "live-MiB")
		b.ReportMetric(float64(stored-input)/(1<<20), "stores-MiB")
		runtime.KeepAlive(c)
		runtime.KeepAlive(src)
	}
}

// decodeStripped decodes the objects as the clientset does and strips
// them as the watch stores do before handing them to the tracker.
func decodeStripped(tb testing.TB, o *apiObjects, tr *controller.ChangeTracker) *clusterSnapshot {
	dec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	src := &clusterSnapshot{svcs: make([]*corev1.Service, 0, len(o.svcs)), slices: make([]*discoveryv1.EndpointSlice, 0, len(o.slices))}
	for _, data := range o.svcs {
		s := &corev1.Service{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		controller.StripUnread(s) //nolint:errcheck
		tr.ServiceChanged(nil, s)
		src.svcs = append(src.svcs, s)
	}
	for _, data := range o.slices {
		s := &discoveryv1.EndpointSlice{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		controller.StripUnread(s) //nolint:errcheck
		tr.SliceChanged(nil, s)
		src.slices = append(src.slices, s)
	}
	return src
}
