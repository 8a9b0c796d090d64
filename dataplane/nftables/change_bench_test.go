package nftables

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// clusterSnapshot is a controller.Snapshot over fixed objects.
type clusterSnapshot struct {
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
}

func (s *clusterSnapshot) Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error) {
	return s.svcs, s.slices, nil
}

// benchCluster is n Services x 10 endpoints (one slice each), the shape of
// bench-k8s's points: VIPs in 198.18.0.0/16, pods in 198.19.0.0/16.
func benchCluster(n int) *clusterSnapshot {
	src := &clusterSnapshot{}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		src.svcs = append(src.svcs, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: types.UID("bench/" + name)},
			Spec: corev1.ServiceSpec{
				Type:      corev1.ServiceTypeClusterIP,
				ClusterIP: netip.AddrFrom4([4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}).String(),
				Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			},
		})
		src.slices = append(src.slices, benchSlice(name, i, -1))
	}
	return src
}

// benchSlice is Service i's slice; endpoint unready (0-9) is not ready.
func benchSlice(name string, i, unready int) *discoveryv1.EndpointSlice {
	port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-a", UID: types.UID("bench/slice/" + name),
			Labels: map[string]string{discoveryv1.LabelServiceName: name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := range 10 {
		k := i*10 + j
		ready := j != unready
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("%s-%d", name, j)},
		})
	}
	return sl
}

// ackAll answers every netlink request with an ack, as the kernel does for
// a batch it accepts: Flush then runs its whole path (marshalling,
// sending, reading acks) without a kernel.
func ackAll(reqs []netlink.Message) ([]netlink.Message, error) {
	out := make([]netlink.Message, 0, len(reqs))
	for _, m := range reqs {
		if m.Header.Flags&netlink.Acknowledge == 0 {
			continue
		}
		out = append(out, netlink.Message{Header: netlink.Header{Type: netlink.Error, Sequence: m.Header.Sequence, PID: m.Header.PID}, Data: make([]byte, 4)})
	}
	return out, nil
}

// changeBench is the agent over the dual-stack nftables dataplane as
// cmd/steelyard wires it (a tracker, metrics, conntrack cleaning), each
// family's kernel replaced: nft (the first sync) by discardNFT, which
// knftables.Fake would make minutes long at 10,000 Services, and the
// netlink socket a change goes to (netlink.go) by one that acks.
type changeBench struct {
	src   *clusterSnapshot
	tr    *controller.ChangeTracker
	agent *controller.Agent
	v4    *Proxier
}

func newChangeBench(tb testing.TB, n int) *changeBench {
	c := newFirstSyncBench(tb)
	c.src = benchCluster(n)
	c.agent.Source = c.src
	if err := c.agent.Sync(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// newFirstSyncBench is a changeBench before its first sync, with no
// source yet.
func newFirstSyncBench(tb testing.TB) *changeBench {
	var ps [2]*Proxier
	for i, family := range []int{4, 6} {
		f := famOf(family)
		p := NewProxier(&discardNFT{Interface: knftables.NewFake(f.nfFamily, TableName)}, Config{Family: family})
		p.netlink = newNetlinkWriter(family)
		p.netlink.opts = []gnft.ConnOption{gnft.WithTestDial(ackAll)}
		// The kernel answers this with one small message (canary.go);
		// the Fake would list every chain. No table before the first
		// sync: it runs in batches of BatchPorts, as on a node.
		p.tableExists = func() (bool, error) { return p.eng.Synced(), nil }
		ps[i] = p
	}
	tr := controller.NewChangeTracker()
	a := &controller.Agent{
		Tracker: tr, Builder: controller.NewBuilder(),
		Dataplane: dataplane.NewDualStack(ps[0], ps[1]), FullSyncPeriod: time.Hour,
		Metrics: controller.NewMetrics(), Conntrack: conntrack.NewFake(),
	}
	return &changeBench{tr: tr, agent: a, v4: ps[0]}
}

// change turns endpoint 3 of Service i unready (odd k) or ready again
// (even k), as an informer event, and syncs.
func (c *changeBench) change(tb testing.TB, i, k int) {
	name := fmt.Sprintf("svc-%d", i)
	unready := -1
	if k%2 == 1 {
		unready = 3
	}
	prev, cur := c.src.slices[i], benchSlice(name, i, unready)
	c.src.slices[i] = cur
	c.tr.SliceChanged(prev, cur)
	if err := c.agent.Sync(); err != nil {
		tb.Fatal(err)
	}
	if !c.v4.lastNetlink {
		tb.Fatal("the change did not go over netlink")
	}
}

// BenchmarkEndpointChange10kx10 is one endpoint change at 10,000 Services x
// 10 endpoints through the whole path of a node: informer event ->
// ChangeTracker -> Agent.Sync (Builder.Update, metrics, conntrack) ->
// DualStack -> reconcile engine -> render -> the netlink batch, sent to a
// socket that acks it. The change -> kernel CPU of issue 21, without the
// API server and the kernel's own work.
func BenchmarkEndpointChange10kx10(b *testing.B) { benchEndpointChange(b, 10000) }

// BenchmarkEndpointChange1kx10 is BenchmarkEndpointChange10kx10 at 1,000
// Services: what grows with the cluster is the difference.
func BenchmarkEndpointChange1kx10(b *testing.B) { benchEndpointChange(b, 1000) }

func benchEndpointChange(b *testing.B, n int) {
	quietLogs(b)
	c := newChangeBench(b, n)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := benchCPU()
	k := 0
	for b.Loop() {
		k++
		c.change(b, n*4321/10000, k)
	}
	b.ReportMetric(float64(benchCPU()-cpu0)/float64(k), "cpu-ns/op")
}

// quietLogs discards logrus' output until tb ends: the agent logs each
// sync at Info, as in production, formatted but not printed.
func quietLogs(tb testing.TB) {
	out := logrus.StandardLogger().Out
	logrus.SetOutput(io.Discard)
	tb.Cleanup(func() { logrus.SetOutput(out) })
}

// benchCPU is the process's user plus system CPU time: on a loaded
// machine it says what a change costs where wall time says mostly how
// long it waited for a core.
func benchCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHeapAfterFirstSync10kx10 is the live heap once the first sync
// of 10,000 Services x 10 endpoints is done (after a GC), whole and
// without the API objects (which the informers' stores hold in
// production, stripped): what the agent, the Builder and the dataplane
// keep. STEELYARD_HEAPPROFILE=file writes the heap profile
// (go tool pprof -sample_index=inuse_space).
func BenchmarkHeapAfterFirstSync10kx10(b *testing.B) {
	quietLogs(b)
	for b.Loop() {
		objs := benchCluster(10000)
		base := liveHeap()
		c := newChangeBench(b, 10000)
		total := liveHeap()
		b.ReportMetric(float64(total)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(total-base)/(1<<20), "kept-MiB")
		if f := os.Getenv("STEELYARD_HEAPPROFILE"); f != "" {
			w, err := os.Create(f)
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.WriteHeapProfile(w); err != nil {
				b.Fatal(err)
			}
			w.Close()
		}
		runtime.KeepAlive(objs)
		runtime.KeepAlive(c)
	}
}

// liveHeap is the heap in use after a GC.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkPeakMemory10kx10 is the first sync of 10,000 Services x 10
// endpoints and then 300 endpoint changes at three GOGC settings: the
// process's peak of memory mapped for Go (sampled every 5 ms, released
// pages excluded: what RSS follows) beside the CPU of the first sync and
// of a change, the trade-off a lower GOGC makes. The API objects (47 MiB,
// not stripped as the informers strip them) are in the figures.
func BenchmarkPeakMemory10kx10(b *testing.B) {
	quietLogs(b)
	for _, gogc := range []int{100, 50, 25} {
		b.Run(fmt.Sprintf("gogc=%d", gogc), func(b *testing.B) {
			old := debug.SetGCPercent(gogc)
			defer debug.SetGCPercent(old)
			for b.Loop() {
				debug.FreeOSMemory()
				stop := make(chan struct{})
				peak := make(chan uint64)
				go samplePeak(stop, peak)
				cpu0 := benchCPU()
				c := newChangeBench(b, 10000)
				cpu1 := benchCPU()
				for k := 1; k <= 300; k++ {
					c.change(b, k*31%10000, k)
				}
				cpu2 := benchCPU()
				close(stop)
				b.ReportMetric(float64(<-peak)/(1<<20), "peak-MiB")
				b.ReportMetric((cpu1 - cpu0).Seconds(), "first-cpu-s")
				b.ReportMetric(float64(cpu2-cpu1)/300, "change-cpu-ns")
			}
		})
	}
}

// samplePeak sends the peak of Go's mapped, unreleased memory seen
// between its start and stop.
func samplePeak(stop <-chan struct{}, peak chan<- uint64) {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	var most uint64
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		metrics.Read(s)
		most = max(most, s[0].Value.Uint64()-s[1].Value.Uint64())
		select {
		case <-stop:
			peak <- most
			return
		case <-t.C:
		}
	}
}

// apiObjects is what the API server sends a watch of n Services x 10
// endpoints: each object protobuf-encoded on its own (a streaming list
// sends one watch event per object), with the fields the API server fills
// in (managedFields, clusterIPs, owner and target references).
type apiObjects struct{ svcs, slices [][]byte }

// managedFieldsOf is one field manager's entry, as kubectl apply leaves
// it: a few hundred bytes of JSON per object, decoded then stripped.
func managedFieldsOf(manager string) []metav1.ManagedFieldsEntry {
	t := metav1.NewTime(time.Date(2026, 12, 6, 23, 50, 30, 0, time.UTC))
	return []metav1.ManagedFieldsEntry{{
		Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &t, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`)},
	}}
}

// protobufEncoder encodes an object as the API server sends it.
func protobufEncoder(tb testing.TB) func(k8sruntime.Object) []byte {
	ser := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	return func(obj k8sruntime.Object) []byte {
		data, err := k8sruntime.Encode(scheme.Codecs.EncoderForVersion(ser, obj.GetObjectKind().GroupVersionKind().GroupVersion()), obj)
		if err != nil {
			tb.Fatal(err)
		}
		return data
	}
}

func newAPIObjects(tb testing.TB, n int) *apiObjects {
	enc := protobufEncoder(tb)
	o := &apiObjects{}
	single := corev1.IPFamilyPolicySingleStack
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		vip := netip.AddrFrom4([4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}).String()
		svc := &corev1.Service{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{
				Namespace: "bench", Name: name, UID: types.UID(fmt.Sprintf("10000000-0000-0000-0000-%012d", i)), ResourceVersion: "123456",
				Labels: map[string]string{"app": name}, ManagedFields: managedFieldsOf("kubectl-client-side-apply"),
			},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeClusterIP, ClusterIP: vip, ClusterIPs: []string{vip},
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
				SessionAffinity: corev1.ServiceAffinityNone, Selector: map[string]string{"app": name},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		o.svcs = append(o.svcs, enc(svc))
		sl := benchSlice(name, i, -1)
		sl.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		sl.ManagedFields = managedFieldsOf("kube-controller-manager")
		tr := true
		sl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: svc.UID, Controller: &tr, BlockOwnerDeletion: &tr}}
		for j := range sl.Endpoints {
			node, zone := fmt.Sprintf("node-%d", j%3), "zone-a"
			sl.Endpoints[j].NodeName, sl.Endpoints[j].Zone = &node, &zone
			sl.Endpoints[j].Conditions.Serving, sl.Endpoints[j].Conditions.Terminating = &tr, new(bool)
			sl.Endpoints[j].TargetRef.UID = types.UID(fmt.Sprintf("20000000-0000-0000-0000-%012d", i*10+j))
		}
		o.slices = append(o.slices, enc(sl))
	}
	return o
}

// decode is what the clientset does with each event: the objects, fresh,
// handed to the tracker as the watch stores do (added: no previous state),
// each passed through strip first (the stores' transform).
func (o *apiObjects) decode(tb testing.TB, tr interface {
	ServiceChanged(p, c *corev1.Service) bool
	SliceChanged(p, c *discoveryv1.EndpointSlice) bool
}, strip func(obj any)) *clusterSnapshot {
	dec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	src := &clusterSnapshot{svcs: make([]*corev1.Service, 0, len(o.svcs)), slices: make([]*discoveryv1.EndpointSlice, 0, len(o.slices))}
	for _, data := range o.svcs {
		s := &corev1.Service{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		strip(s)
		tr.ServiceChanged(nil, s)
		src.svcs = append(src.svcs, s)
	}
	for _, data := range o.slices {
		s := &discoveryv1.EndpointSlice{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		strip(s)
		tr.SliceChanged(nil, s)
		src.slices = append(src.slices, s)
	}
	return src
}

// dropManagedFields is the strip of the stores before StripUnread dropped
// more (what BenchmarkFirstSyncFromAPI measured).
func dropManagedFields(obj any) {
	if m, ok := obj.(interface {
		SetManagedFields([]metav1.ManagedFieldsEntry)
	}); ok {
		m.SetManagedFields(nil)
	}
}

// BenchmarkFirstSyncFromAPI10kx10 is a node's first sync of 10,000
// Services x 10 endpoints, in process: the API server's protobuf objects
// decoded and handed to the ChangeTracker, then the agent's first Sync
// (Build of every Service, reconcile engine, render, the netlink batches
// sent to a socket that acks them). What bench-k8s's first sync costs
// steelyard's own process, without the API server, the HTTP transport and
// the kernel's work. cpu-s are the process's CPU-seconds (user+system);
// under load they, not wall time, are the figure to compare.
func BenchmarkFirstSyncFromAPI10kx10(b *testing.B) { benchFirstSyncFromAPI(b, 10000) }

// BenchmarkFirstSyncFromAPI1kx10 is BenchmarkFirstSyncFromAPI10kx10 at
// 1,000 Services.
func BenchmarkFirstSyncFromAPI1kx10(b *testing.B) { benchFirstSyncFromAPI(b, 1000) }

func benchFirstSyncFromAPI(b *testing.B, n int) {
	quietLogs(b)
	objs := newAPIObjects(b, n)
	var decode, sync time.Duration
	b.ReportAllocs()
	for b.Loop() {
		c := newFirstSyncBench(b)
		decode += cpuOf(func() { c.agent.Source = objs.decode(b, c.tr, dropManagedFields) })
		sync += cpuOf(func() {
			if err := c.agent.Sync(); err != nil {
				b.Fatal(err)
			}
		})
	}
	for unit, d := range map[string]time.Duration{"decode-cpu-s": decode, "sync-cpu-s": sync, "cpu-s": decode + sync} {
		b.ReportMetric(d.Seconds()/float64(b.N), unit)
	}
}

// cpuOf is the process's CPU time while f runs.
func cpuOf(f func()) time.Duration {
	c0 := benchCPU()
	f()
	return benchCPU() - c0
}
