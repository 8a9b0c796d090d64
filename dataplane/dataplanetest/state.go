// Package dataplanetest holds what the dataplanes' tests and benchmarks
// share: synthetic desired states in the test address ranges.
package dataplanetest

import (
	"fmt"
	"net/netip"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Synthetic returns n TCP Service ports named bench/svc-<i> with m ready,
// serving endpoints each, weights 1..m, sorted. VIPs come from
// 198.18.0.0/16 and pods from 198.19.0.0/16; both repeat past 65,536
// (pods past 6,553 Services at m = 10), which no dataplane minds since
// every port is its own table.
func Synthetic(n, m int) dataplane.State {
	s := dataplane.State{Services: make([]dataplane.ServicePort, 0, n)}
	for i := range n {
		sp := dataplane.ServicePort{
			Name:     dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http"},
			VIP:      dataplane.VIP{IP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), Port: 80, Protocol: dataplane.TCP},
			Backends: make([]dataplane.Backend, 0, m),
		}
		for j := range m {
			k := i*m + j
			sp.Backends = append(sp.Backends, dataplane.Backend{IP: netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}),
				Port: 8080, Weight: float64(j + 1), Ready: true, Serving: true})
		}
		s.Services = append(s.Services, sp)
	}
	s.Sort()
	return s
}
