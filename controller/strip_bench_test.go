package controller

import (
	"encoding/json"
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkSliceStoreHeap10kx10 is the heap that 10,000 EndpointSlices of
// 10 endpoints take once decoded (from JSON, so every string is its own
// allocation as from the API server), as the API server sends them (owner
// reference, full target references, hostnames) and after stripUnread.
func BenchmarkSliceStoreHeap10kx10(b *testing.B) {
	raw := make([][]byte, 0, 10000)
	for i := range 10000 {
		name := fmt.Sprintf("svc-%d", i)
		sl := benchSlice(name, i)
		data, err := json.Marshal(sl)
		if err != nil {
			b.Fatal(err)
		}
		raw = append(raw, data)
	}
	for b.Loop() {
		for _, strip := range []bool{false, true} {
			before := heapNow()
			kept := make([]*discoveryv1.EndpointSlice, 0, len(raw))
			for _, data := range raw {
				sl := &discoveryv1.EndpointSlice{}
				if err := json.Unmarshal(data, sl); err != nil {
					b.Fatal(err)
				}
				if strip {
					stripUnread(sl) //nolint:errcheck
				}
				kept = append(kept, sl)
			}
			unit := "full-MiB"
			if strip {
				unit = "stripped-MiB"
			}
			b.ReportMetric(float64(heapNow()-before)/(1<<20), unit)
			runtime.KeepAlive(kept)
		}
	}
}

// benchSlice is Service i's slice as the EndpointSlice controller writes
// it: an owner reference, and per endpoint a target reference, node name
// and zone.
func benchSlice(name string, i int) *discoveryv1.EndpointSlice {
	t := true
	port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "bench", Name: name + "-abcde", UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), ResourceVersion: "123456",
			Labels:          map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: types.UID(fmt.Sprintf("10000000-0000-0000-0000-%012d", i)), Controller: &t, BlockOwnerDeletion: &t}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := range 10 {
		k := i*10 + j
		node, zone := fmt.Sprintf("node-%d", k%3), "zone-a"
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("198.19.%d.%d", (k>>8)&0xff, k&0xff)},
			Conditions: discoveryv1.EndpointConditions{Ready: &t, Serving: &t},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("%s-7d9f8-%05d", name, j),
				UID: types.UID(fmt.Sprintf("20000000-0000-0000-0000-%012d", k))},
			NodeName: &node,
			Zone:     &zone,
		})
	}
	return sl
}

// heapNow is the heap in use after a GC.
func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
