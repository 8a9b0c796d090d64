package nftables

import (
	"fmt"
	"net/netip"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

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
func BenchmarkMemoryFromAPI10kx10(b *testing.B) { benchMemory(b, newAPIObjects(b, 10000)) }

// BenchmarkMemorySeeded10kx10 is BenchmarkMemoryFromAPI10kx10 with the
// objects of bench-k8s (test/bench/k8s seed.go, written into etcd): no
// labels, selector, managedFields or target references, three conditions
// per endpoint. The shape whose peak RSS issue 21's goal compares.
func BenchmarkMemorySeeded10kx10(b *testing.B) { benchMemory(b, newSeededObjects(b, 10000)) }

func benchMemory(b *testing.B, objs *apiObjects) {
	quietLogs(b)
	old := debug.SetGCPercent(50)
	defer debug.SetGCPercent(old)
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

// newSeededObjects encodes n Services x 10 endpoints as bench-k8s seeds
// them (test/bench/k8s seed.go).
func newSeededObjects(tb testing.TB, n int) *apiObjects {
	enc := protobufEncoder(tb)
	o := &apiObjects{}
	created := metav1.NewTime(time.Date(2026, 12, 6, 23, 50, 30, 0, time.UTC))
	single := corev1.IPFamilyPolicySingleStack
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		vip := netip.AddrFrom4([4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}).String()
		o.svcs = append(o.svcs, enc(&corev1.Service{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID(fmt.Sprintf("00000001-0000-4000-8000-%012x", i)),
				ResourceVersion: "123456", CreationTimestamp: created},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
				SessionAffinity: corev1.ServiceAffinityNone,
				Ports:           []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
			},
		}))
		port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
		sl := &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Namespace: "bench", Name: name + "-1", UID: types.UID(fmt.Sprintf("00000003-0000-4000-8000-%012x", i)),
				ResourceVersion: "123456", CreationTimestamp: created, Generation: 1,
				Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "bench-k8s"},
			},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
		}
		for j := range 10 {
			k := i*10 + j
			t, f := true, false
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t, Terminating: &f},
			})
		}
		o.slices = append(o.slices, enc(sl))
	}
	return o
}

// decodeStripped decodes the objects as the clientset does and strips
// them as the watch stores do before handing them to the tracker.
func decodeStripped(tb testing.TB, o *apiObjects, tr *controller.ChangeTracker) *clusterSnapshot {
	return o.decode(tb, tr, func(obj any) { controller.StripUnread(obj) }) //nolint:errcheck
}
