package dataplane

import (
	"net/netip"
	"testing"
)

// PortsOf finds exactly the ports of one Service in a sorted State, also
// beside Services whose names extend it ("a/web" and "a/web-2", "a/we").
func TestPortsOf(t *testing.T) {
	port := func(ns, name, p, vip string) ServicePort {
		return ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: p}, VIP: VIP{IP: netip.MustParseAddr(vip), Port: 80, Protocol: TCP}}
	}
	s := State{Services: []ServicePort{
		port("a", "web-2", "http", "198.18.0.5"),
		port("a", "web", "http", "198.18.0.1"),
		port("a", "web", "admin", "198.18.0.1"),
		port("a", "web", "http", "2001:2::1"),
		port("a", "we", "http", "198.18.0.3"),
		port("b", "web", "http", "198.18.0.4"),
		port("a-b", "web", "http", "198.18.0.6"),
	}}
	s.Sort()
	for _, tc := range []struct {
		svc  ServiceName
		want int
	}{
		{ServiceName{"a", "web"}, 3},
		{ServiceName{"a", "web-2"}, 1},
		{ServiceName{"a", "we"}, 1},
		{ServiceName{"b", "web"}, 1},
		{ServiceName{"a-b", "web"}, 1},
		{ServiceName{"a", "w"}, 0},
		{ServiceName{"c", "web"}, 0},
	} {
		got := s.PortsOf(tc.svc)
		if len(got) != tc.want {
			t.Errorf("%s: %d ports, want %d", tc.svc, len(got), tc.want)
		}
		for _, sp := range got {
			if sp.Name.Service() != tc.svc {
				t.Errorf("%s: got a port of %s", tc.svc, sp.Name.Service())
			}
		}
	}
}
