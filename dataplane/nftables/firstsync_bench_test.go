package nftables

import (
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

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

func newAPIObjects(tb testing.TB, n int) *apiObjects {
	ser := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	enc := func(obj runtime.Object) []byte {
		data, err := runtime.Encode(scheme.Codecs.EncoderForVersion(ser, obj.GetObjectKind().GroupVersionKind().GroupVersion()), obj)
		if err != nil {
			tb.Fatal(err)
		}
		return data
	}
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
// handed to the tracker as the watch stores do (added: no previous state).
func (o *apiObjects) decode(tb testing.TB, tr interface {
	ServiceChanged(p, c *corev1.Service) bool
	SliceChanged(p, c *discoveryv1.EndpointSlice) bool
}) *clusterSnapshot {
	dec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	src := &clusterSnapshot{svcs: make([]*corev1.Service, 0, len(o.svcs)), slices: make([]*discoveryv1.EndpointSlice, 0, len(o.slices))}
	for _, data := range o.svcs {
		s := &corev1.Service{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		s.ManagedFields = nil // stripUnread
		tr.ServiceChanged(nil, s)
		src.svcs = append(src.svcs, s)
	}
	for _, data := range o.slices {
		s := &discoveryv1.EndpointSlice{}
		if _, _, err := dec.Decode(data, nil, s); err != nil {
			tb.Fatal(err)
		}
		s.ManagedFields = nil
		tr.SliceChanged(nil, s)
		src.slices = append(src.slices, s)
	}
	return src
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
	out := logrus.StandardLogger().Out
	logrus.SetOutput(io.Discard)
	defer logrus.SetOutput(out)
	objs := newAPIObjects(b, n)
	b.ReportAllocs()
	var decodeCPU, syncCPU time.Duration
	for b.Loop() {
		c := newFirstSyncBench(b)
		cpu0 := benchCPU()
		c.agent.Source = objs.decode(b, c.tr)
		cpu1 := benchCPU()
		if err := c.agent.Sync(); err != nil {
			b.Fatal(err)
		}
		decodeCPU += cpu1 - cpu0
		syncCPU += benchCPU() - cpu1
	}
	b.ReportMetric(decodeCPU.Seconds()/float64(b.N), "decode-cpu-s")
	b.ReportMetric(syncCPU.Seconds()/float64(b.N), "sync-cpu-s")
	b.ReportMetric((decodeCPU+syncCPU).Seconds()/float64(b.N), "cpu-s")
}
