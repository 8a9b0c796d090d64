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

// Conntrack test IP plan:
//
//	198.18.0.13:53     UDP VIP dns, endpoints 198.19.4.2 (dns-1) and
//	                   198.19.4.3 (dns-2) on 5353
//	198.18.0.16:123    UDP VIP ntp, endpoint 198.19.4.4:123
//	30053              dns's node port (NodePort tests)
//	198.18.1.13:53     dns's external IP; 198.18.2.13:53 its load-balancer IP
//	198.19.0.1         the node (local), 198.19.254.1 its LAN address (local)
//	198.19.9.9         another host (not local)
//	198.19.254.2       the client
//	2001:2::13:53      IPv6 VIP dns6, endpoint [2001:2:0:1::2]:5353,
//	                   node 2001:2:0:fe::1, client 2001:2:0:fd::2
var (
	dnsVIP   = netip.MustParseAddrPort("198.18.0.13:53")
	ntpVIP   = netip.MustParseAddrPort("198.18.0.16:123")
	dns1     = netip.MustParseAddrPort("198.19.4.2:5353")
	dns2     = netip.MustParseAddrPort("198.19.4.3:5353")
	ntp1     = netip.MustParseAddrPort("198.19.4.4:123")
	cli      = netip.MustParseAddr("198.19.254.2")
	dnsNP    = uint16(30053)
	dnsExt   = netip.MustParseAddr("198.18.1.13")
	dnsLB    = netip.MustParseAddr("198.18.2.13")
	nodeIP   = netip.MustParseAddr("198.19.0.1")
	nodeLAN  = netip.MustParseAddr("198.19.254.1")
	elsewhr  = netip.MustParseAddr("198.19.9.9")
	dnsVIP6  = netip.MustParseAddrPort("[2001:2::13]:53")
	dns6     = netip.MustParseAddrPort("[2001:2:0:1::2]:5353")
	nodeIP6  = netip.MustParseAddr("2001:2:0:fe::1")
	cli6     = netip.MustParseAddr("2001:2:0:fd::2")
	nodeAddr = []netip.Addr{nodeIP, nodeLAN, nodeIP6}
)

func udpFlow(sport uint16, vip, backend netip.AddrPort) conntrack.Flow {
	return udpFlowFrom(netip.AddrPortFrom(cli, sport), vip, backend)
}

func udpFlowFrom(c, dst, backend netip.AddrPort) conntrack.Flow {
	return conntrack.Flow{Protocol: dataplane.UDP, OrigSrc: c, OrigDst: dst, ReplySrc: backend, ReplyDst: c}
}

func udpBackend(ap netip.AddrPort, weight float64, ready bool) dataplane.Backend {
	return dataplane.Backend{IP: ap.Addr(), Port: ap.Port(), Weight: weight, Ready: ready, Serving: ready}
}

// local marks a backend as running on this node.
func local(b dataplane.Backend) dataplane.Backend {
	b.Local = true
	return b
}

func udpPort(name string, vip netip.AddrPort, bs ...dataplane.Backend) dataplane.ServicePort {
	return dataplane.ServicePort{
		Name:     dataplane.ServicePortName{Namespace: "demo", Name: name, Port: "udp"},
		VIP:      dataplane.VIP{IP: vip.Addr(), Port: vip.Port(), Protocol: dataplane.UDP},
		Backends: bs,
	}
}

// exposed gives dns its node port, external IP and load-balancer IP.
func exposed(sp dataplane.ServicePort) dataplane.ServicePort {
	sp.NodePort = dnsNP
	sp.ExternalIPs = []netip.Addr{dnsExt}
	sp.LoadBalancerIPs = []netip.Addr{dnsLB}
	return sp
}

// Filters as StaleFlows spells them.
func epFilter(vip, be netip.AddrPort) conntrack.Filter {
	return conntrack.Filter{Protocol: dataplane.UDP, OrigDst: vip.Addr(), OrigDstPort: vip.Port(), ReplySrc: be.Addr(), ReplySrcPort: be.Port()}
}

func npEpFilter(np uint16, be netip.AddrPort) conntrack.Filter {
	return conntrack.Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: np, ReplySrc: be.Addr(), ReplySrcPort: be.Port()}
}

func addrFilter(a netip.AddrPort) conntrack.Filter {
	return conntrack.Filter{Protocol: dataplane.UDP, OrigDst: a.Addr(), OrigDstPort: a.Port()}
}

func npFilter(np uint16, family int) conntrack.Filter {
	return conntrack.Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: np, Family: family}
}

func untranslated(f conntrack.Filter) conntrack.Filter {
	f.Untranslated = true
	return f
}

func at(ip netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ip, port) }

func TestStaleFlows(t *testing.T) {
	both := udpPort("dns", dnsVIP, udpBackend(dns1, 1, true), udpBackend(dns2, 1, true))
	only2 := udpPort("dns", dnsVIP, udpBackend(dns2, 1, true))
	none := udpPort("dns", dnsVIP)
	ntp := udpPort("ntp", ntpVIP, udpBackend(ntp1, 1, true))
	tcp := exposed(both)
	tcp.VIP.Protocol = dataplane.TCP
	sctp := exposed(both)
	sctp.VIP.Protocol = dataplane.SCTP
	sctpGone := exposed(only2)
	sctpGone.VIP.Protocol = dataplane.SCTP
	etpLocal := func(sp dataplane.ServicePort) dataplane.ServicePort {
		sp = exposed(sp)
		sp.ExternalLocal = true
		return sp
	}
	itpLocal := func(sp dataplane.ServicePort) dataplane.ServicePort {
		sp.InternalLocal = true
		return sp
	}
	ext, lb := at(dnsExt, 53), at(dnsLB, 53)
	// Every entry point of exposed(dns) that follows the external policy.
	externalUntranslated := []conntrack.Filter{untranslated(npFilter(dnsNP, 4)), untranslated(addrFilter(ext)), untranslated(addrFilter(lb))}
	cases := []struct {
		name       string
		prev, next []dataplane.ServicePort
		want       []conntrack.Filter
	}{
		{"nothing changed", []dataplane.ServicePort{exposed(both), ntp}, []dataplane.ServicePort{exposed(both), ntp}, nil},
		{"endpoint removed", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{only2, ntp},
			[]conntrack.Filter{epFilter(dnsVIP, dns1)}},
		{"endpoint removed: every entry point", []dataplane.ServicePort{exposed(both), ntp}, []dataplane.ServicePort{exposed(only2), ntp},
			[]conntrack.Filter{epFilter(dnsVIP, dns1), npEpFilter(dnsNP, dns1), epFilter(ext, dns1), epFilter(lb, dns1)}},
		{"endpoint no longer ready", []dataplane.ServicePort{exposed(both)},
			[]dataplane.ServicePort{exposed(udpPort("dns", dnsVIP, udpBackend(dns1, 0, false), udpBackend(dns2, 1, true)))},
			[]conntrack.Filter{epFilter(dnsVIP, dns1), npEpFilter(dnsNP, dns1), epFilter(ext, dns1), epFilter(lb, dns1)}},
		{"endpoint drained to weight 0 keeps its flows", []dataplane.ServicePort{exposed(both)},
			[]dataplane.ServicePort{exposed(udpPort("dns", dnsVIP, udpBackend(dns1, 0, true), udpBackend(dns2, 1, true)))}, nil},
		{"endpoint port changed", []dataplane.ServicePort{both},
			[]dataplane.ServicePort{udpPort("dns", dnsVIP, udpBackend(at(dns1.Addr(), 5354), 1, true), udpBackend(dns2, 1, true))},
			[]conntrack.Filter{epFilter(dnsVIP, dns1)}},
		{"service removed", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{ntp},
			[]conntrack.Filter{addrFilter(dnsVIP)}},
		{"service removed: every entry point", []dataplane.ServicePort{exposed(both), ntp}, []dataplane.ServicePort{ntp},
			[]conntrack.Filter{addrFilter(dnsVIP), npFilter(dnsNP, 4), addrFilter(ext), addrFilter(lb)}},
		{"external IP and node port removed, VIP kept", []dataplane.ServicePort{exposed(both)}, []dataplane.ServicePort{both},
			[]conntrack.Filter{npFilter(dnsNP, 4), addrFilter(ext), addrFilter(lb)}},
		{"node port renumbered", []dataplane.ServicePort{exposed(both)},
			[]dataplane.ServicePort{func() dataplane.ServicePort { sp := exposed(both); sp.NodePort = 30054; return sp }()},
			[]conntrack.Filter{npFilter(dnsNP, 4), untranslated(npFilter(30054, 4))}},
		{"first endpoint", []dataplane.ServicePort{none}, []dataplane.ServicePort{both},
			[]conntrack.Filter{untranslated(addrFilter(dnsVIP))}},
		{"first endpoint: every entry point", []dataplane.ServicePort{exposed(none)}, []dataplane.ServicePort{exposed(both)},
			append([]conntrack.Filter{untranslated(addrFilter(dnsVIP))}, externalUntranslated...)},
		{"new external entry points of a Service with endpoints", []dataplane.ServicePort{both}, []dataplane.ServicePort{exposed(both)},
			externalUntranslated},
		{"first endpoint drained: nothing forwards yet", []dataplane.ServicePort{exposed(none)},
			[]dataplane.ServicePort{exposed(udpPort("dns", dnsVIP, udpBackend(dns1, 0, true)))}, nil},

		// Traffic policies: kube-proxy deletes nothing when an endpoint
		// only stops being eligible; the entry point that starts
		// forwarding loses its untranslated entries.
		{"ETP Local: the local endpoint leaves, a remote one stays", []dataplane.ServicePort{etpLocal(udpPort("dns", dnsVIP, local(udpBackend(dns1, 1, true)), udpBackend(dns2, 1, true)))},
			[]dataplane.ServicePort{etpLocal(only2)},
			[]conntrack.Filter{epFilter(dnsVIP, dns1), npEpFilter(dnsNP, dns1), epFilter(ext, dns1), epFilter(lb, dns1)}},
		{"ETP Local: an endpoint stops being local, keeps its flows", []dataplane.ServicePort{etpLocal(udpPort("dns", dnsVIP, local(udpBackend(dns1, 1, true)), udpBackend(dns2, 1, true)))},
			[]dataplane.ServicePort{etpLocal(both)}, nil},
		{"ETP Cluster to Local keeps every flow", []dataplane.ServicePort{exposed(both)}, []dataplane.ServicePort{etpLocal(both)}, nil},
		{"ETP Local: the first local endpoint", []dataplane.ServicePort{etpLocal(both)},
			[]dataplane.ServicePort{etpLocal(udpPort("dns", dnsVIP, local(udpBackend(dns1, 1, true)), udpBackend(dns2, 1, true)))},
			externalUntranslated},
		{"ITP Local: the first local endpoint", []dataplane.ServicePort{itpLocal(both)},
			[]dataplane.ServicePort{itpLocal(udpPort("dns", dnsVIP, local(udpBackend(dns1, 1, true)), udpBackend(dns2, 1, true)))},
			[]conntrack.Filter{untranslated(addrFilter(dnsVIP))}},

		{"IPv6 node port", []dataplane.ServicePort{func() dataplane.ServicePort {
			sp := udpPort("dns", dnsVIP6, udpBackend(dns6, 1, true))
			sp.NodePort = dnsNP
			return sp
		}()}, nil, []conntrack.Filter{addrFilter(dnsVIP6), npFilter(dnsNP, 6)}},
		{"TCP is left to TCP", []dataplane.ServicePort{tcp}, nil, nil},
		// SCTP associations end with SHUTDOWN or ABORT, which conntrack
		// sees; kube-proxy clears only UDP (kubernetes#115299).
		{"SCTP is left to SCTP", []dataplane.ServicePort{sctp}, []dataplane.ServicePort{sctpGone}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := StaleFlows(&dataplane.State{Services: c.prev}, &dataplane.State{Services: c.next})
			if !sameFilters(got, c.want) {
				t.Fatalf("got\n  %v\nwant\n  %v", got, c.want)
			}
			// The agent keeps only the UDP ports of the previous State
			// (udpPorts), with a TCP port beside them here.
			prev := append([]dataplane.ServicePort{tcp}, c.prev...)
			if kept := StaleFlows(udpPorts(&dataplane.State{Services: prev}), &dataplane.State{Services: c.next}); !sameFilters(kept, c.want) {
				t.Errorf("from the kept UDP ports: got\n  %v\nwant\n  %v", kept, c.want)
			}
			for _, f := range got {
				if err := f.Validate(); err != nil {
					t.Errorf("invalid filter: %v", err)
				}
			}
		})
	}
}

// sameFilters compares as sets.
func sameFilters(got, want []conntrack.Filter) bool {
	if len(got) != len(want) {
		return false
	}
	in := map[conntrack.Filter]bool{}
	for _, f := range got {
		in[f] = true
	}
	for _, f := range want {
		if !in[f] {
			return false
		}
	}
	return true
}

// TestStaleFlowsOnTable applies StaleFlows to a table holding the flows of
// every entry point and of unrelated traffic, and checks what is left.
func TestStaleFlowsOnTable(t *testing.T) {
	np := at(nodeIP, dnsNP)
	npLAN := at(nodeLAN, dnsNP)
	ext, lb := at(dnsExt, 53), at(dnsLB, 53)
	// The dns flows, one per entry point and endpoint; node port flows are
	// masqueraded (reply to the node), as with the cluster policy.
	masq := func(f conntrack.Flow) conntrack.Flow {
		f.ReplyDst = at(f.OrigDst.Addr(), 61000+f.OrigSrc.Port()%1000)
		return f
	}
	vipTo1, vipTo2 := udpFlow(20000, dnsVIP, dns1), udpFlow(20001, dnsVIP, dns2)
	npTo1, npTo2 := masq(udpFlow(20002, np, dns1)), masq(udpFlow(20003, npLAN, dns2))
	npLANTo1 := masq(udpFlow(20004, npLAN, dns1))
	extTo1, lbTo1 := udpFlow(20005, ext, dns1), udpFlow(20006, lb, dns1)
	// Unrelated: the pod directly; another VIP; another node port (on the
	// node's own address); the same port number on another host, from the
	// node; TCP to the node port; the endpoint behind an IPv6 node port.
	direct := udpFlow(20010, dns1, dns1)
	other := udpFlow(20011, ntpVIP, ntp1)
	otherNP := masq(udpFlow(20012, at(nodeIP, 30054), dns1))
	fromNode := udpFlowFrom(at(nodeIP, 40000), at(elsewhr, dnsNP), at(elsewhr, dnsNP))
	tcp := masq(udpFlow(20013, np, dns1))
	tcp.Protocol = dataplane.TCP
	np6 := udpFlowFrom(at(cli6, 20014), at(nodeIP6, dnsNP), dns6)
	// Untranslated: sent before the node port had an endpoint.
	rawNP := udpFlow(20020, np, np)
	rawVIP := udpFlow(20021, dnsVIP, dnsVIP)
	rawExt := udpFlow(20022, ext, ext)
	unrelated := []conntrack.Flow{direct, other, otherNP, fromNode, tcp, np6}

	ntp := udpPort("ntp", ntpVIP, udpBackend(ntp1, 1, true))
	both := exposed(udpPort("dns", dnsVIP, udpBackend(dns1, 1, true), udpBackend(dns2, 1, true)))
	only2 := exposed(udpPort("dns", dnsVIP, udpBackend(dns2, 1, true)))
	none := exposed(udpPort("dns", dnsVIP))
	cases := []struct {
		name       string
		prev, next []dataplane.ServicePort
		table      []conntrack.Flow
		left       []conntrack.Flow
	}{
		{"dns-1 leaves", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{only2, ntp},
			append([]conntrack.Flow{vipTo1, vipTo2, npTo1, npTo2, npLANTo1, extTo1, lbTo1}, unrelated...),
			append([]conntrack.Flow{vipTo2, npTo2}, unrelated...)},
		{"dns goes", []dataplane.ServicePort{both, ntp}, []dataplane.ServicePort{ntp},
			append([]conntrack.Flow{vipTo1, vipTo2, npTo1, npTo2, npLANTo1, extTo1, lbTo1}, unrelated...),
			unrelated},
		{"first endpoints", []dataplane.ServicePort{none, ntp}, []dataplane.ServicePort{both, ntp},
			append([]conntrack.Flow{rawNP, rawVIP, rawExt}, unrelated...),
			unrelated},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ct := conntrack.NewFake(c.table...)
			ct.SetLocal(nodeAddr...)
			filters := StaleFlows(&dataplane.State{Services: c.prev}, &dataplane.State{Services: c.next})
			if _, err := ct.Delete(filters...); err != nil {
				t.Fatal(err)
			}
			got, _ := ct.List()
			if !sameFlows(got, c.left) {
				t.Errorf("filters %v left\n  %v\nwant\n  %v", filters, got, c.left)
			}
		})
	}
}

func sameFlows(got, want []conntrack.Flow) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

// TestStaleFlowsNow is the first sync after a start: no previous state, so
// the live table is compared with the new state.
func TestStaleFlowsNow(t *testing.T) {
	np, ext := at(nodeIP, dnsNP), at(dnsExt, 53)
	gone := netip.MustParseAddrPort("198.19.4.9:5353") // left while the agent was down
	live := []conntrack.Flow{
		udpFlow(20000, dnsVIP, dns1), udpFlow(20001, np, dns2), udpFlow(20002, ext, dns1),
		udpFlow(20003, dns1, dns1),                                             // direct
		udpFlow(20004, ntpVIP, ntp1),                                           // a VIP steelyard does not know
		udpFlow(20005, at(nodeIP, 30054), ntp1),                                // a node port steelyard does not know
		udpFlowFrom(at(nodeIP, 40000), at(elsewhr, dnsNP), at(elsewhr, dnsNP)), // the node to another host
	}
	stale := []conntrack.Flow{
		udpFlow(20010, dnsVIP, gone), udpFlow(20011, np, gone), udpFlow(20012, ext, gone),
		udpFlow(20013, np, np), udpFlow(20014, dnsVIP, dnsVIP), // untranslated, from before the rules
	}
	next := &dataplane.State{Services: []dataplane.ServicePort{exposed(udpPort("dns", dnsVIP, udpBackend(dns1, 1, true), udpBackend(dns2, 1, true)))}}
	ct := conntrack.NewFake(append(append([]conntrack.Flow(nil), live...), stale...)...)
	ct.SetLocal(nodeAddr...)
	all, _ := ct.List()
	if _, err := ct.Delete(StaleFlowsNow(all, next)...); err != nil {
		t.Fatal(err)
	}
	if got, _ := ct.List(); !sameFlows(got, live) {
		t.Errorf("left\n  %v\nwant\n  %v", got, live)
	}

	// Without endpoints nothing is translated: untranslated flows stay.
	raw := []conntrack.Flow{udpFlow(20013, np, np), udpFlow(20014, dnsVIP, dnsVIP)}
	if fs := StaleFlowsNow(raw, &dataplane.State{Services: []dataplane.ServicePort{exposed(udpPort("dns", dnsVIP))}}); len(fs) != 0 {
		t.Errorf("a Service without endpoints: %v, want none", fs)
	}
}

// flakyDataplane fails when told to.
type flakyDataplane struct {
	fail bool
}

func (d *flakyDataplane) Sync(dataplane.State, dataplane.SyncRequest) (dataplane.SyncResult, error) {
	if d.fail {
		return dataplane.SyncResult{}, errors.New("iptables-restore: exit status 1")
	}
	return dataplane.SyncResult{}, nil
}
func (d *flakyDataplane) Explain() ([]dataplane.ServiceView, error) { return nil, nil }
func (d *flakyDataplane) Cleanup() error                            { return nil }

func dnsObjects(eps ...discoveryv1.Endpoint) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	return dnsObjectsOf(nil, eps...)
}

// dnsObjectsOf returns the dns Service, adjusted by tweak, and its slice.
func dnsObjectsOf(tweak func(*corev1.Service), eps ...discoveryv1.Endpoint) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := makeService("demo", "dns", func(s *corev1.Service) {
		s.Spec.ClusterIP = dnsVIP.Addr().String()
		s.Spec.Ports = []corev1.ServicePort{{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP}}
		if tweak != nil {
			tweak(s)
		}
	})
	sl := makeSlice("demo", "dns", "dns-a", eps, func(sl *discoveryv1.EndpointSlice) {
		sl.Ports = []discoveryv1.EndpointPort{slicePortOf("udp", 5353, corev1.ProtocolUDP)}
	})
	return []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl}
}

// expectTable fails unless ct holds exactly want, in order.
func expectTable(t *testing.T, ct *conntrack.Fake, when string, want ...conntrack.Flow) {
	t.Helper()
	got, _ := ct.List()
	if !sameFlows(got, want) {
		t.Fatalf("%s: table\n  %v\nwant\n  %v", when, got, want)
	}
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
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: dp, Conntrack: ct, FullSyncPeriod: time.Minute, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}

	// The first sync (a start or restart) keeps every live flow and
	// deletes only the one to an endpoint the Service no longer has.
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after the first sync", toDNS1, toDNS2, direct, other, tcp)

	// dns-1 leaves; the sync fails: nothing may be deleted (the old rules
	// still send new flows to dns-1).
	src.svcs, src.slices = dnsObjects(endpoint("198.19.4.3", "dns-2", condReady))
	dp.fail = true
	if err := a.Sync(); err == nil {
		t.Fatal("sync did not fail")
	}
	expectTable(t, ct, "after a failed sync", toDNS1, toDNS2, direct, other, tcp)

	// The retry succeeds: only the UDP flow through the VIP to dns-1 goes.
	dp.fail = false
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after dns-1 left", toDNS2, direct, other, tcp)

	// The Service goes: every UDP flow to its VIP goes, nothing else.
	src.svcs, src.slices = nil, nil
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after the Service left", direct, other, tcp)
}

// The agent over a NodePort Service with an external IP and
// externalTrafficPolicy Local, from Kubernetes objects: endpoints leaving
// clear every entry point; an endpoint that only stops being local keeps
// its flows.
func TestAgentDeletesStaleUDPFlowsOfExternalEntryPoints(t *testing.T) {
	np, ext := at(nodeIP, dnsNP), at(dnsExt, 53)
	vipTo1, npTo1, extTo1 := udpFlow(20000, dnsVIP, dns1), udpFlow(20001, np, dns1), udpFlow(20002, ext, dns1)
	vipTo2, npTo2, extTo2 := udpFlow(20003, dnsVIP, dns2), udpFlow(20004, np, dns2), udpFlow(20005, ext, dns2)
	otherNP := udpFlow(20006, at(nodeIP, 30054), dns1)
	ct := conntrack.NewFake(vipTo1, npTo1, extTo1, vipTo2, npTo2, extTo2, otherNP)
	ct.SetLocal(nodeAddr...)

	nodePort := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(dnsNP)
		s.Spec.ExternalIPs = []string{dnsExt.String()}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	on := func(ep discoveryv1.Endpoint, node string) discoveryv1.Endpoint {
		ep.NodeName = &node
		return ep
	}
	src := &staticSource{}
	src.svcs, src.slices = dnsObjectsOf(nodePort, on(endpoint("198.19.4.2", "dns-1", condReady), "node-a"), on(endpoint("198.19.4.3", "dns-2", condReady), "node-b"))
	b := NewBuilder()
	b.NodeName = "node-a"
	a := &Agent{Source: src, Builder: b, Dataplane: &flakyDataplane{}, Conntrack: ct, FullSyncPeriod: time.Minute, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after the first sync", vipTo1, npTo1, extTo1, vipTo2, npTo2, extTo2, otherNP)

	// dns-1 moves to node-b (the same address, as far as the Service can
	// tell): no longer local, still serving. New external flows are
	// dropped; established ones keep flowing, as kube-proxy leaves them.
	src.svcs, src.slices = dnsObjectsOf(nodePort, on(endpoint("198.19.4.2", "dns-1", condReady), "node-b"), on(endpoint("198.19.4.3", "dns-2", condReady), "node-b"))
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after dns-1 stopped being local", vipTo1, npTo1, extTo1, vipTo2, npTo2, extTo2, otherNP)

	// dns-2 leaves: its flows go from the VIP, the node port and the
	// external IP; the other node port's flow stays.
	src.svcs, src.slices = dnsObjectsOf(nodePort, on(endpoint("198.19.4.2", "dns-1", condReady), "node-b"))
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct, "after dns-2 left", vipTo1, npTo1, extTo1, otherNP)
}

func (d *flakyDataplane) Counts() ([]dataplane.EndpointCount, error) { return nil, nil }

// failingCleaner is a conntrack table whose deletions fail while fail is
// set.
type failingCleaner struct {
	*conntrack.Fake
	fail bool
}

func (c *failingCleaner) Delete(filters ...conntrack.Filter) (int, error) {
	if c.fail {
		return 0, errors.New("netlink: no buffer space")
	}
	return c.Fake.Delete(filters...)
}

// With a tracker, partial syncs compare only the changed Services' UDP
// ports: an endpoint leaving the DNS Service clears its flows, a change of
// another Service none; a deletion that failed is retried by the next
// sync although that sync changes another Service.
func TestAgentDeletesStaleUDPFlowsOnPartialSyncs(t *testing.T) {
	toDNS1, toDNS2 := udpFlow(20000, dnsVIP, dns1), udpFlow(20001, dnsVIP, dns2)
	ct := &failingCleaner{Fake: conntrack.NewFake(toDNS1, toDNS2)}
	src := &staticSource{}
	src.svcs, src.slices = dnsObjects(endpoint("198.19.4.2", "dns-1", condReady), endpoint("198.19.4.3", "dns-2", condReady))
	web := makeService("demo", "web", withIP("198.18.0.80"))
	webSlice := makeSlice("demo", "web", "web-1", []discoveryv1.Endpoint{ready("198.19.5.2", "web-1")}, nil)
	src.svcs, src.slices = append(src.svcs, web), append(src.slices, webSlice)
	tr := NewChangeTracker()
	a := &Agent{Source: src, Tracker: tr, Builder: NewBuilder(), Dataplane: &flakyDataplane{}, Conntrack: ct,
		FullSyncPeriod: time.Hour, Clock: clocktesting.NewFakeClock(time.Unix(1000, 0))}
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	expectTable(t, ct.Fake, "after the first sync", toDNS1, toDNS2)
	change := func(i int, sl *discoveryv1.EndpointSlice) {
		t.Helper()
		tr.SliceChanged(src.slices[i], sl)
		src.slices[i] = sl
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	// web's endpoint changes: no UDP flow goes.
	change(1, makeSlice("demo", "web", "web-1", []discoveryv1.Endpoint{ready("198.19.5.3", "web-2")}, nil))
	expectTable(t, ct.Fake, "after a change of web", toDNS1, toDNS2)
	// dns-1 leaves while deletions fail: nothing goes.
	ct.fail = true
	_, dnsOnly := dnsObjects(endpoint("198.19.4.3", "dns-2", condReady))
	change(0, dnsOnly[0])
	expectTable(t, ct.Fake, "after a failed deletion", toDNS1, toDNS2)
	// The next sync changes only web, and retries dns-1's deletion.
	ct.fail = false
	change(1, makeSlice("demo", "web", "web-1", []discoveryv1.Endpoint{ready("198.19.5.4", "web-3")}, nil))
	expectTable(t, ct.Fake, "after the retry", toDNS2)
	// dns-2 leaves too, through a partial sync.
	_, none := dnsObjects()
	change(0, none[0])
	expectTable(t, ct.Fake, "after dns-2 left")
}
