package controller

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// BenchmarkBuild10kx10 measures one Build over 10,000 Services with one
// 10-endpoint slice each: the work every sync does before the dataplane.
func BenchmarkBuild10kx10(b *testing.B) {
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := 0; i < 10000; i++ {
		name := fmt.Sprintf("svc-%d", i)
		svcs = append(svcs, makeService("bench", name, func(s *corev1.Service) {
			s.Spec.ClusterIP = fmt.Sprintf("198.18.%d.%d", (i+1)>>8, (i+1)&0xff)
		}))
		var eps []discoveryv1.Endpoint
		for j := 0; j < 10; j++ {
			k := i*10 + j
			eps = append(eps, endpoint(fmt.Sprintf("198.19.%d.%d", (k>>8)&0xff, k&0xff), fmt.Sprintf("%s-%d", name, j), condReady))
		}
		slices = append(slices, makeSlice("bench", name, name+"-a", eps, nil))
	}
	bd := NewBuilder()
	b.ResetTimer()
	for range b.N {
		bd.Build(svcs, slices)
	}
}
