package iptables

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// benchState builds n Services x m endpoints (VIPs in 198.18.0.0/16,
// endpoints in 198.19.0.0/16).
func benchState(n, m int) dataplane.State {
	var s dataplane.State
	for i := 0; i < n; i++ {
		sp := dataplane.ServicePort{
			Name: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http"},
			VIP:  dataplane.VIP{IP: netip.AddrFrom4([4]byte{198, 18, byte((i + 1) >> 8), byte(i + 1)}), Port: 80, Protocol: dataplane.TCP},
		}
		for j := 0; j < m; j++ {
			k := (i*m + j) % 65000
			sp.Backends = append(sp.Backends, dataplane.Backend{IP: netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}), Port: 8080, Weight: float64(1 + j%4)})
		}
		s.Services = append(s.Services, sp)
	}
	return s
}

func BenchmarkRender10kx10(b *testing.B) {
	s := benchState(10000, 10)
	b.ResetTimer()
	for range b.N {
		r := Render(s, testCfg)
		_ = FullRestore(r)
	}
}

func BenchmarkExplain1kx10(b *testing.B) {
	benchExplain(b, 1000, 10)
}

// benchExplain parses the iptables-save text of n Services x m endpoints
// and explains it, as `steelyard explain` does.
func benchExplain(b *testing.B, n, m int) {
	f := NewFake()
	if _, err := NewProxier(f, testCfg).Sync(benchState(n, m), dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	saved, _ := f.SaveAll()
	runtime.GC()
	b.ResetTimer()
	start, _ := cpuSeconds()
	for range b.N {
		rs, err := ParseRuleset(saved)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Views(rs); err != nil {
			b.Fatal(err)
		}
	}
	// CPU-s per op, the garbage collector's workers included: on a
	// loaded machine it says more than wall time.
	b.StopTimer()
	end, _ := cpuSeconds()
	b.ReportMetric((end-start)/float64(b.N), "cpu-s/op")
}

// BenchmarkExplain1kx100 is explain at bench-k8s's largest size: 1,000
// Services x 100 endpoints (100,000 endpoint chains, rules without
// per-endpoint comments above terseEndpoints).
func BenchmarkExplain1kx100(b *testing.B) {
	benchExplain(b, 1000, 100)
}
