package controller

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// Conntrack test IP plan: UDP VIP dns 198.18.0.13:53 with endpoints
// 198.19.4.2 (dns-1) and 198.19.4.3 (dns-2) on 5353; UDP VIP ntp
// 198.18.0.16:123 with 198.19.4.4:123; the client 198.19.254.2.
var (
	dnsVIP = netip.MustParseAddrPort("198.18.0.13:53")
	ntpVIP = netip.MustParseAddrPort("198.18.0.16:123")
	dns1   = netip.MustParseAddrPort("198.19.4.2:5353")
	dns2   = netip.MustParseAddrPort("198.19.4.3:5353")
	ntp1   = netip.MustParseAddrPort("198.19.4.4:123")
	cli    = netip.MustParseAddr("198.19.254.2")
)

func udpFlow(sport uint16, vip, backend netip.AddrPort) conntrack.Flow {
	c := netip.AddrPortFrom(cli, sport)
	return conntrack.Flow{Protocol: dataplane.UDP, OrigSrc: c, OrigDst: vip, ReplySrc: backend, ReplyDst: c}
}

func udpBackend(ap netip.AddrPort, weight float64, ready bool) dataplane.Backend {
	return dataplane.Backend{IP: ap.Addr(), Port: ap.Port(), Weight: weight, Ready: ready, Serving: ready}
}

func udpPort(name string, vip netip.AddrPort, bs ...dataplane.Backend) dataplane.ServicePort {
	return dataplane.ServicePort{
		Name:     dataplane.ServicePortName{Namespace: "demo", Name: name, Port: "udp"},
		VIP:      dataplane.VIP{IP: vip.Addr(), Port: vip.Port(), Protocol: dataplane.UDP},
		Backends: bs,
	}
}

func TestStaleFlows(t *testing.T) {
	both := udpPort("dns", dnsVIP, udpBackend(dns1, 1, true), udpBackend(dns2, 1, true))
	ntp := udpPort("ntp", ntpVIP, udpBackend(ntp1, 1, true))
	tcp := both
	tcp.VIP.Protocol = dataplane.TCP
	epFilter := func(vip, be netip.AddrPort) conntrack.Filter {
		return conntrack.Filter{Protocol: dataplane.UDP, OrigDst: vip.Addr(), OrigDstPort: vip.Port(), ReplySrc: be.Addr(), ReplySrcPort: be.Port()}
	}
	cases := []struct {
		name       string
		prev, next []dataplane.ServicePort
		want       []conntrack.Filter
	}{
		{"nothing changed", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{both, ntp}, nil},
		{"endpoint removed", []dataplane.ServicePort{both, ntp},
			[]dataplane.ServicePort{udpPort("dns", dnsVIP, udpBackend(dns2, 1, true)), ntp},
			[]conntrack.Filter{epFilter(dnsVIP, dns1)}},
		{"endpoint no longer ready", []dataplane.ServicePort{both},
			[]dataplane.ServicePort{udpPort("dns", dnsVIP, udpBackend(dns1, 0, false), udpBackend(dns2, 1, true))},
			[]conntrack.Filter{epFilter(dnsVIP, dns1)}},
		{"endpoint drained to weight 0 keeps its flows", []dataplane.ServicePort{both},
			[]dataplane.ServicePort{udpPort("dns", dnsVIP, udpBackend(dns1, 0, true), udpBackend(dns2, 1, true))}, nil},
		{"endpoint port changed", []dataplane.ServicePort{both},
			[]dataplane.ServicePort{udpPort("dns", dnsVIP, udpBackend(netip.AddrPortFrom(dns1.Addr(), 5354), 1, true), udpBackend(dns2, 1, true))},
			[]conntrack.Filter{epFilter(dnsVIP, dns1)}},
		{"service removed", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{ntp},
			[]conntrack.Filter{{Protocol: dataplane.UDP, OrigDst: dnsVIP.Addr(), OrigDstPort: 53}}},
		{"first endpoint", []dataplane.ServicePort{udpPort("dns", dnsVIP)}, []dataplane.ServicePort{both},
			[]conntrack.Filter{{Protocol: dataplane.UDP, OrigDst: dnsVIP.Addr(), OrigDstPort: 53, ReplySrc: dnsVIP.Addr()}}},
		{"TCP is left to TCP", []dataplane.ServicePort{tcp}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := StaleFlows(&dataplane.State{Services: c.prev}, &dataplane.State{Services: c.next})
			if len(got) != len(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("got %v, want %v", got, c.want)
				}
			}
		})
	}
}

// flakyDataplane fails when told to.
type flakyDataplane struct {
	fail bool
}

func (d *flakyDataplane) Sync(dataplane.State, bool) error {
	if d.fail {
		return errors.New("iptables-restore: exit status 1")
	}
	return nil
}
func (d *flakyDataplane) Explain() ([]dataplane.ServiceView, error) { return nil, nil }
func (d *flakyDataplane) Cleanup() error                            { return nil }

func dnsObjects(eps ...discoveryv1.Endpoint) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := makeService("demo", "dns", func(s *corev1.Service) {
		s.Spec.ClusterIP = dnsVIP.Addr().String()
		s.Spec.Ports = []corev1.ServicePort{{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP}}
	})
	sl := makeSlice("demo", "dns", "dns-a", eps, func(sl *discoveryv1.EndpointSlice) {
		sl.Ports = []discoveryv1.EndpointPort{slicePortOf("udp", 5353, corev1.ProtocolUDP)}
	})
	return []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl}
}

func TestAgentDeletesStaleUDPFlows(t *testing.T) {
	toDNS1 := udpFlow(20000, dnsVIP, dns1)
	toDNS2 := udpFlow(20001, dnsVIP, dns2)
	direct := udpFlow(20002, dns1, dns1)                                       // client -> dns-1 without a VIP
	gone := udpFlow(20003, dnsVIP, netip.MustParseAddrPort("198.19.4.9:5353")) // left while the agent was down
	other := udpFlow(20004, ntpVIP, ntp1)                                      // a VIP steelyard does not know
	tcp := toDNS1
	tcp.Protocol, tcp.OrigSrc, tcp.ReplyDst = dataplane.TCP, netip.AddrPortFrom(cli, 20005), netip.AddrPortFrom(cli, 20005)
	ct := conntrack.NewFake(toDNS1, toDNS2, direct, gone, other, tcp)

	src := &staticSource{}
	src.svcs, src.slices = dnsObjects(endpoint("198.19.4.2", "dns-1", condReady), endpoint("198.19.4.3", "dns-2", condReady))
	dp := &flakyDataplane{}
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: dp, Conntrack: ct, SyncPeriod: time.Minute, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	expect := func(when string, want ...conntrack.Flow) {
		t.Helper()
		got, _ := ct.List()
		if len(got) != len(want) {
			t.Fatalf("%s: table %v, want %v", when, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: table %v, want %v", when, got, want)
			}
		}
	}

	// The first sync (a start or restart) keeps every live flow and
	// deletes only the one to an endpoint the Service no longer has.
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expect("after the first sync", toDNS1, toDNS2, direct, other, tcp)

	// dns-1 leaves; the sync fails: nothing may be deleted (the old rules
	// still send new flows to dns-1).
	src.svcs, src.slices = dnsObjects(endpoint("198.19.4.3", "dns-2", condReady))
	dp.fail = true
	if err := a.Sync(); err == nil {
		t.Fatal("sync did not fail")
	}
	expect("after a failed sync", toDNS1, toDNS2, direct, other, tcp)

	// The retry succeeds: only the UDP flow through the VIP to dns-1 goes.
	dp.fail = false
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expect("after dns-1 left", toDNS2, direct, other, tcp)

	// The Service goes: every UDP flow to its VIP goes, nothing else.
	src.svcs, src.slices = nil, nil
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expect("after the Service left", direct, other, tcp)
}
