package controller

// Build for kube-proxy parity: entry points, traffic policies, affinity,
// topology and dual-stack. IP plan as in build_test.go; IPv6 from
// 2001:2::/48 (clusterIPs 2001:2::<n>, pods 2001:2:0:<n>::<pod>).

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/dataplane"
)

// onNode places an endpoint on node in zone, hinted for hintZones.
func onNode(ep discoveryv1.Endpoint, node, zone string, hintZones ...string) discoveryv1.Endpoint {
	ep.NodeName = ptr.To(node)
	ep.Zone = ptr.To(zone)
	if len(hintZones) > 0 {
		ep.Hints = &discoveryv1.EndpointHints{}
		for _, z := range hintZones {
			ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
	return ep
}

func TestBuildEntryPointsAndPolicies(t *testing.T) {
	lb := makeService("demo", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"198.18.1.10", "2001:2::1:10"}
		s.Spec.LoadBalancerSourceRanges = []string{"198.19.254.0/24", " 198.19.253.7/24 ", "2001:2:0:fd::/64"}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30999
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(30))}}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "198.18.2.10"},
			{IP: "198.18.2.11", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)},
			{Hostname: "lb.example"},
		}
	})
	clusterOnly := makeService("demo", "plain", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.11"
		s.Spec.Ports[0].NodePort = 30081 // ignored for type ClusterIP
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	sls := []*discoveryv1.EndpointSlice{
		makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.1.2", "web-1"), "node-a", "zone-a"),
			onNode(ready("198.19.1.3", "web-2"), "node-b", "zone-b"),
		}, nil),
	}
	b := NewBuilder()
	b.NodeName = "node-a"
	st, problems := b.Build([]*corev1.Service{lb, clusterOnly}, sls)
	if len(problems) > 0 {
		t.Errorf("problems: %v", problemStrings(problems))
	}
	got := byName(st)
	web := got["demo/web:http"]
	if web.NodePort != 30080 || web.HealthCheckNodePort != 30999 || !web.ExternalLocal || !web.InternalLocal || web.AffinitySeconds != 30 {
		t.Errorf("web: %+v", web)
	}
	if want := []netip.Addr{netip.MustParseAddr("198.18.1.10")}; !slicesEqual(web.ExternalIPs, want) {
		t.Errorf("externalIPs %v, want %v (the IPv6 one belongs to the IPv6 port)", web.ExternalIPs, want)
	}
	if want := []netip.Addr{netip.MustParseAddr("198.18.2.10")}; !slicesEqual(web.LoadBalancerIPs, want) {
		t.Errorf("load-balancer IPs %v, want %v (ipMode Proxy and hostnames skipped)", web.LoadBalancerIPs, want)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("198.19.254.0/24"), netip.MustParsePrefix("198.19.253.0/24")}; !slicesEqual(web.SourceRanges, want) {
		t.Errorf("source ranges %v, want %v", web.SourceRanges, want)
	}
	local := map[string]bool{}
	for _, be := range web.Backends {
		local[be.Name] = be.Local
		if be.NodeName == "" || be.Zone == "" {
			t.Errorf("%s: node %q zone %q", be.Name, be.NodeName, be.Zone)
		}
	}
	if !local["web-1"] || local["web-2"] {
		t.Errorf("local endpoints %v, want only web-1", local)
	}
	plain := got["demo/plain:http"]
	if plain.NodePort != 0 || plain.ExternalLocal || plain.AffinitySeconds != DefaultAffinitySeconds {
		t.Errorf("plain: %+v", plain)
	}
}

func slicesEqual[T comparable](a, b []T) bool { return slices.Equal(a, b) }

func TestBuildTopology(t *testing.T) {
	hinted := makeService("demo", "hinted", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Annotations = map[string]string{AnnotationWeights: "h-1=1,h-2=3,h-3=5"}
	})
	close := makeService("demo", "close", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.11"
		s.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	})
	partial := makeService("demo", "partial", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.12" })
	elsewhere := makeService("demo", "elsewhere", func(s *corev1.Service) { s.Spec.ClusterIP = "198.18.0.13" })
	sls := []*discoveryv1.EndpointSlice{
		makeSlice("demo", "hinted", "hinted-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.1.2", "h-1"), "node-a", "zone-a", "zone-a"),
			onNode(ready("198.19.1.3", "h-2"), "node-b", "zone-b", "zone-b"),
			onNode(ready("198.19.1.4", "h-3"), "node-c", "zone-b", "zone-a"),
		}, nil),
		makeSlice("demo", "close", "close-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.2.2", "c-1"), "node-a", "zone-a"),
			onNode(ready("198.19.2.3", "c-2"), "node-b", "zone-b"),
		}, nil),
		// One endpoint without hints: topology off (kube-proxy's rule).
		makeSlice("demo", "partial", "partial-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.3.2", "p-1"), "node-a", "zone-a", "zone-a"),
			onNode(ready("198.19.3.3", "p-2"), "node-b", "zone-b"),
		}, nil),
		// Nothing hinted for this zone: every endpoint.
		makeSlice("demo", "elsewhere", "elsewhere-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.4.2", "e-1"), "node-b", "zone-b", "zone-b"),
			onNode(ready("198.19.4.3", "e-2"), "node-c", "zone-c", "zone-c"),
		}, nil),
	}
	b := NewBuilder()
	b.NodeName, b.Zone = "node-a", "zone-a"
	st, _ := b.Build([]*corev1.Service{hinted, close, partial, elsewhere}, sls)
	cluster := map[string][]string{}
	for _, sp := range st.Services {
		for _, be := range sp.ClusterBackends() {
			cluster[sp.Name.Name] = append(cluster[sp.Name.Name], be.Name)
		}
	}
	want := map[string][]string{
		"hinted":    {"h-1", "h-3"},
		"close":     {"c-1"},
		"partial":   {"p-1", "p-2"},
		"elsewhere": {"e-1", "e-2"},
	}
	for k, w := range want {
		if !slices.Equal(cluster[k], w) {
			t.Errorf("%s: cluster-wide endpoints %v, want %v", k, cluster[k], w)
		}
	}
	// Weights apply among the endpoints that remain: h-1 1, h-3 5.
	hp := byName(st)["demo/hinted:http"]
	views := dataplane.Expected(dataplane.State{Services: []dataplane.ServicePort{hp}})
	for _, bv := range views[0].Backends {
		if want := map[string]float64{"198.19.1.2": 100.0 / 6, "198.19.1.4": 500.0 / 6}[bv.IP]; dataplane.RoundShare(want) != bv.Share {
			t.Errorf("%s: share %v, want %v", bv.IP, bv.Share, want)
		}
	}
	// Without a zone, topology is off.
	b2 := NewBuilder()
	st2, _ := b2.Build([]*corev1.Service{hinted}, sls)
	if n := len(st2.Services[0].ClusterBackends()); n != 3 {
		t.Errorf("no node zone: %d cluster-wide endpoints, want 3", n)
	}
}

func TestBuildDualStack(t *testing.T) {
	svc := makeService("demo", "web", func(s *corev1.Service) {
		s.Spec.ClusterIP = "198.18.0.10"
		s.Spec.ClusterIPs = []string{"198.18.0.10", "2001:2::a"}
		s.Spec.Type = corev1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"198.18.1.10", "2001:2::1:10"}
	})
	v4 := makeSlice("demo", "web", "web-v4", []discoveryv1.Endpoint{ready("198.19.1.2", "web-1")}, nil)
	v6 := makeSlice("demo", "web", "web-v6", []discoveryv1.Endpoint{ready("2001:2:0:1::2", "web-1")}, func(sl *discoveryv1.EndpointSlice) {
		sl.AddressType = discoveryv1.AddressTypeIPv6
	})
	b := NewBuilder()
	st, _ := b.Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{v4, v6})
	if len(st.Services) != 1 || st.Services[0].Family() != 4 {
		t.Fatalf("IPv4 only by default: %+v", st.Services)
	}
	b.EnableIPv6()
	st, problems := b.Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{v4, v6})
	if len(problems) > 0 || len(st.Services) != 2 {
		t.Fatalf("dual-stack: %+v, problems %v", st.Services, problemStrings(problems))
	}
	for _, sp := range st.Services {
		if len(sp.Backends) != 1 || sp.Backends[0].IP.Is4() != sp.VIP.IP.Is4() || sp.NodePort != 30080 ||
			len(sp.ExternalIPs) != 1 || sp.ExternalIPs[0].Is4() != sp.VIP.IP.Is4() {
			t.Errorf("%s: %+v", sp.VIP, sp)
		}
	}
}

// TestBuildTrafficDistributionGA covers the GA values of KEP-3015:
// PreferSameZone behaves as PreferClose; PreferSameNode keeps this node's
// endpoints, falls back to this zone's, then to every endpoint.
func TestBuildTrafficDistributionGA(t *testing.T) {
	svc := func(name, ip, td string) *corev1.Service {
		return makeService("demo", name, func(s *corev1.Service) {
			s.Spec.ClusterIP = ip
			s.Spec.TrafficDistribution = ptr.To(td)
		})
	}
	services := []*corev1.Service{
		svc("zone", "198.18.0.20", corev1.ServiceTrafficDistributionPreferSameZone),
		svc("node", "198.18.0.21", corev1.ServiceTrafficDistributionPreferSameNode),
		svc("nodezone", "198.18.0.22", corev1.ServiceTrafficDistributionPreferSameNode),
		svc("nodeany", "198.18.0.23", corev1.ServiceTrafficDistributionPreferSameNode),
	}
	sls := []*discoveryv1.EndpointSlice{
		makeSlice("demo", "zone", "zone-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.5.2", "z-1"), "node-b", "zone-a"),
			onNode(ready("198.19.5.3", "z-2"), "node-c", "zone-b"),
		}, nil),
		makeSlice("demo", "node", "node-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.6.2", "n-1"), "node-a", "zone-a"),
			onNode(ready("198.19.6.3", "n-2"), "node-b", "zone-a"),
			onNode(ready("198.19.6.4", "n-3"), "node-c", "zone-b"),
		}, nil),
		makeSlice("demo", "nodezone", "nodezone-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.7.2", "nz-1"), "node-b", "zone-a"),
			onNode(ready("198.19.7.3", "nz-2"), "node-c", "zone-b"),
		}, nil),
		makeSlice("demo", "nodeany", "nodeany-a", []discoveryv1.Endpoint{
			onNode(ready("198.19.8.2", "na-1"), "node-b", "zone-b"),
			onNode(ready("198.19.8.3", "na-2"), "node-c", "zone-c"),
		}, nil),
	}
	b := NewBuilder()
	b.NodeName, b.Zone = "node-a", "zone-a"
	st, _ := b.Build(services, sls)
	cluster := map[string][]string{}
	for _, sp := range st.Services {
		for _, be := range sp.ClusterBackends() {
			cluster[sp.Name.Name] = append(cluster[sp.Name.Name], be.Name)
		}
	}
	want := map[string][]string{
		"zone":     {"z-1"},
		"node":     {"n-1"},
		"nodezone": {"nz-1"},
		"nodeany":  {"na-1", "na-2"},
	}
	for k, w := range want {
		if !slices.Equal(cluster[k], w) {
			t.Errorf("%s: cluster-wide endpoints %v, want %v", k, cluster[k], w)
		}
	}
}
