package controller

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The kernel's counts are exported per endpoint with the configured
// weight and ratio of the last synced State beside them.
func TestEndpointMetrics(t *testing.T) {
	m := NewMetrics()
	m.WatchEndpoints(func() ([]dataplane.EndpointCount, error) {
		return []dataplane.EndpointCount{
			{Service: "demo/web:http", Protocol: dataplane.TCP, Endpoint: netip.MustParseAddrPort("198.19.1.2:8080"), NewConnections: 2030},
			{Service: "demo/web:http", Protocol: dataplane.TCP, Endpoint: netip.MustParseAddrPort("198.19.1.3:8080"), NewConnections: 17970},
		}, nil
	})
	b := func(ip string, w float64) dataplane.Backend {
		return dataplane.Backend{IP: netip.MustParseAddr(ip), Port: 8080, Weight: w, Ready: true, Serving: true}
	}
	m.endpoints.setState(dataplane.State{Services: []dataplane.ServicePort{{
		Name:     dataplane.ServicePortName{Namespace: "demo", Name: "web", Port: "http"},
		VIP:      dataplane.VIP{IP: netip.MustParseAddr("198.18.0.10"), Port: 80, Protocol: dataplane.TCP},
		Backends: []dataplane.Backend{b("198.19.1.2", 10), b("198.19.1.3", 90)},
	}}})
	got := map[string]float64{}
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "steelyard_endpoint_") {
			continue
		}
		for _, x := range mf.GetMetric() {
			var l []string
			for _, lp := range x.GetLabel() {
				l = append(l, lp.GetName()+"="+lp.GetValue())
			}
			v := x.GetGauge().GetValue() + x.GetCounter().GetValue()
			got[mf.GetName()+"{"+strings.Join(l, ",")+"}"] = v
		}
	}
	want := map[string]float64{}
	for ep, v := range map[string][3]float64{"198.19.1.2:8080": {2030, 10, 0.1}, "198.19.1.3:8080": {17970, 90, 0.9}} {
		l := "{endpoint=" + ep + ",namespace=demo,port=http,service=web}"
		want[endpointConnsMetric+l], want[endpointWeightMetric+l], want[endpointRatioMetric+l] = v[0], v[1], v[2]
	}
	if len(got) != len(want) {
		t.Errorf("%d series, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
}

// A count whose Service port name the kernel holds in its shortened form
// (a long Gateway route name, dataplane.ShortName) is labelled with the
// full name of the synced State.
func TestEndpointMetricsShortName(t *testing.T) {
	long := dataplane.ServicePortName{Namespace: "gateway-conformance-infra", Name: "gateway-" + strings.Repeat("x", 120), Port: "udp"}
	short := dataplane.ShortName(long.String(), dataplane.NftCommentMax)
	if short == long.String() {
		t.Fatalf("the name is short enough already: %s", short)
	}
	m := NewMetrics()
	m.WatchEndpoints(func() ([]dataplane.EndpointCount, error) {
		return []dataplane.EndpointCount{{Service: short, Protocol: dataplane.UDP, Endpoint: netip.MustParseAddrPort("198.19.1.2:8080"), NewConnections: 7}}, nil
	})
	m.endpoints.setState(dataplane.State{Services: []dataplane.ServicePort{{
		Name:     long,
		VIP:      dataplane.VIP{IP: netip.MustParseAddr("198.18.0.11"), Port: 53, Protocol: dataplane.UDP},
		Backends: []dataplane.Backend{{IP: netip.MustParseAddr("198.19.1.2"), Port: 8080, Weight: 1, Ready: true, Serving: true}},
	}}})
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != endpointConnsMetric {
			continue
		}
		for _, x := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range x.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["service"] != long.Name || l["namespace"] != long.Namespace || l["port"] != long.Port || x.GetCounter().GetValue() != 7 {
				t.Errorf("series %v = %v, want the full name %s and 7", l, x.GetCounter().GetValue(), long)
			}
			found = true
		}
	}
	if !found {
		t.Errorf("no %s series for the shortened name", endpointConnsMetric)
	}
}
