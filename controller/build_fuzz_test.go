package controller

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/steelyard-net/steelyard/dataplane"
)

// checkVIPsInClusterIPs fails t when a built Service port's VIP is not one
// of the clusterIPs (spec.clusterIP, spec.clusterIPs) of a Service of that
// name.
func checkVIPsInClusterIPs(t *testing.T, state dataplane.State, services []*corev1.Service) {
	t.Helper()
	allowed := map[[2]string]map[netip.Addr]bool{}
	for _, s := range services {
		k := [2]string{s.Namespace, s.Name}
		if allowed[k] == nil {
			allowed[k] = map[netip.Addr]bool{}
		}
		for _, raw := range append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...) {
			if a, err := netip.ParseAddr(raw); err == nil {
				allowed[k][a] = true
			}
		}
	}
	for _, sp := range state.Services {
		if !allowed[[2]string{sp.Name.Namespace, sp.Name.Name}][sp.VIP.IP] {
			t.Fatalf("%s: VIP %s is none of the Service's clusterIPs", sp.Name, sp.VIP)
		}
	}
}

// baseline returns the objects of examples/, the Services a random object
// must not disturb.
func baseline(t testing.TB) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	t.Helper()
	paths, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := parseManifest(p, b)
		if err != nil {
			t.Fatal(err)
		}
		svcs, slices = append(svcs, objs.services...), append(slices, objs.slices...)
	}
	return svcs, slices
}

// FuzzBuild adds random objects (one manifest document, with random
// annotations) to the examples' Services and builds both sets: the Builder
// never panics, never emits a VIP outside a Service's clusterIPs, and the
// random objects never change the state of another Service. The random
// objects are moved to their own namespace unless sameNamespace; two
// legitimate influences are excluded: an EndpointSlice labelled for an
// example Service of its namespace (it is that Service's), and a Service
// claiming the same VIP:port as an example (only manifests can, the API
// server allocates clusterIPs; the first by namespace/name keeps it).
func FuzzBuild(f *testing.F) {
	for _, s := range []struct {
		doc                        string
		weights, split, sliceW     string
		sameNamespace, zone, local bool
	}{
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 198.18.1.1, ports: [{name: http, port: 80}]}\n", weights: "web-1=0"},
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: evil, namespace: demo}\nspec: {clusterIP: 198.18.1.2, clusterIPs: [198.18.1.2, \"2001:2::2\"], ports: [{port: 80}, {port: 80, name: b}]}\n", split: "web=1,shop-stable=1,evil=2", sameNamespace: true},
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec: {clusterIP: 198.18.1.3, ports: [{port: 80}]}\n", weights: "*=x", sameNamespace: true},
		{doc: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abcde, namespace: demo, labels: {kubernetes.io/service-name: evil}}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints: [{addresses: [198.19.0.10, \"fe80::1%eth0\", x]}]\n", sliceW: "65536", sameNamespace: true},
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: lb}\nspec: {type: LoadBalancer, clusterIP: 198.18.1.4, externalIPs: [198.18.2.1, x], loadBalancerSourceRanges: [\"198.19.0.0/33\"], externalTrafficPolicy: Local, healthCheckNodePort: 99999, sessionAffinity: ClientIP, ports: [{port: 80, nodePort: 70000}]}\nstatus: {loadBalancer: {ingress: [{ip: 198.18.3.1}, {ip: \"::zz\"}]}}\n", zone: true, local: true},
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: none}\nspec: {clusterIP: None}\n"},
	} {
		f.Add([]byte(s.doc), s.weights, s.split, s.sliceW, s.sameNamespace, s.zone, s.local)
	}
	baseSvcs, baseSlices := baseline(f)
	f.Fuzz(func(t *testing.T, doc []byte, weights, split, sliceWeight string, sameNamespace, zone, local bool) {
		objs, err := parseManifest("fuzz.yaml", doc)
		if err != nil {
			return
		}
		for _, s := range objs.services {
			setAnnotation(&s.Annotations, AnnotationWeights, weights)
			setAnnotation(&s.Annotations, AnnotationSplit, split)
		}
		for _, sl := range objs.slices {
			setAnnotation(&sl.Annotations, AnnotationSliceWeight, sliceWeight)
		}
		checkIsolation(t, baseSvcs, baseSlices, objs, sameNamespace, zone, local)
	})
}

// checkIsolation builds base with and without the random objects and
// checks the properties of FuzzBuild.
func checkIsolation(t *testing.T, baseSvcs []*corev1.Service, baseSlices []*discoveryv1.EndpointSlice, objs manifestObjects, sameNamespace, zone, local bool) {
	t.Helper()
	baseNames := map[[2]string]bool{}
	for _, s := range baseSvcs {
		baseNames[[2]string{s.Namespace, s.Name}] = true
	}
	random := map[[2]string]bool{}
	for _, s := range objs.services {
		if !sameNamespace {
			s.Namespace = "fuzz"
		}
		if k := [2]string{s.Namespace, s.Name}; !baseNames[k] {
			random[k] = true
		}
	}
	legit := false
	for _, sl := range objs.slices {
		if !sameNamespace {
			sl.Namespace = "fuzz"
		}
		if baseNames[[2]string{sl.Namespace, sl.Labels[discoveryv1.LabelServiceName]}] {
			legit = true
		}
	}
	build := func(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) dataplane.State {
		b := NewBuilder()
		b.EnableIPv6()
		if zone {
			b.Zone = "zone-a"
		}
		if local {
			b.NodeName = "node-1"
		}
		st, _ := b.Build(svcs, slices)
		return st
	}
	without := build(baseSvcs, baseSlices)
	svcs := append(append([]*corev1.Service(nil), baseSvcs...), objs.services...)
	slices := append(append([]*discoveryv1.EndpointSlice(nil), baseSlices...), objs.slices...)
	with := build(svcs, slices)
	checkVIPsInClusterIPs(t, with, svcs)
	if legit {
		return
	}
	baseVIPs := map[dataplane.VIP]bool{}
	for _, sp := range without.Services {
		baseVIPs[sp.VIP] = true
	}
	var others []dataplane.ServicePort
	for _, sp := range with.Services {
		if random[[2]string{sp.Name.Namespace, sp.Name.Name}] {
			if baseVIPs[sp.VIP] {
				return // a VIP clash, excluded (see above)
			}
			continue
		}
		others = append(others, sp)
	}
	for _, s := range objs.services {
		// A random Service claiming an example's VIP can also lose it
		// to the example, and be dropped: also a clash.
		for _, raw := range append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...) {
			for v := range baseVIPs {
				if a, err := netip.ParseAddr(raw); err == nil && a == v.IP {
					return
				}
			}
		}
	}
	if !reflect.DeepEqual(others, without.Services) {
		t.Fatalf("random objects changed other Services:\nwithout: %+v\nwith:    %+v", without.Services, others)
	}
}

// FuzzBuildObjects is FuzzBuild with the random Service and EndpointSlice
// made from fuzzed fields rather than decoded from a document, so the
// fuzzer explores addresses, ports, protocols, types, conditions and
// annotations directly.
func FuzzBuildObjects(f *testing.F) {
	f.Add("web", "198.18.1.1", "2001:2::1", int32(80), "TCP", uint8(0), "web-1=1", "", "web", "198.19.9.1", "2001:2::9", int32(8080), "", uint8(0), false, false)
	f.Add("shop", "198.18.0.12", "", int32(80), "", uint8(2), "", "shop-stable=1,evil=1", "shop-stable", "198.19.9.2", "", int32(0), "7", uint8(3), true, true)
	f.Add("x", "::ffff:198.18.1.2", "198.18.1.2", int32(65536), "UDP", uint8(3), "*=0", "x=1", "x", "fe80::1%eth0", "198.19.9.3", int32(-1), "abc", uint8(5), false, true)
	f.Add("lb", "198.18.1.3", "None", int32(443), "SCTP", uint8(1), "", "", "lb", "198.19.9.4", "198.19.9.4", int32(443), "65535", uint8(6), true, false)
	baseSvcs, baseSlices := baseline(f)
	types := []corev1.ServiceType{"", corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}
	f.Fuzz(func(t *testing.T, name, ip1, ip2 string, port int32, proto string, typ uint8, weights, split, sliceFor, addr1, addr2 string, targetPort int32, sliceWeight string, cond uint8, sameNamespace, zone bool) {
		svc := &corev1.Service{}
		svc.Namespace, svc.Name = "demo", name
		svc.Spec.Type = types[int(typ)%len(types)]
		svc.Spec.ClusterIP = ip1
		if ip2 != "" {
			svc.Spec.ClusterIPs = []string{ip1, ip2}
		}
		svc.Spec.ExternalIPs = []string{ip2}
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: port, Protocol: corev1.Protocol(proto), NodePort: targetPort}}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: addr2}}
		setAnnotation(&svc.Annotations, AnnotationWeights, weights)
		setAnnotation(&svc.Annotations, AnnotationSplit, split)
		bools := func(bit uint8) *bool { b := cond&bit != 0; return &b }
		portName, p := "http", corev1.Protocol(proto)
		sl := &discoveryv1.EndpointSlice{}
		sl.Namespace, sl.Name = "demo", "fuzz-"+sliceFor
		sl.Labels = map[string]string{discoveryv1.LabelServiceName: sliceFor}
		sl.AddressType = discoveryv1.AddressTypeIPv4
		if cond&8 != 0 {
			sl.AddressType = discoveryv1.AddressTypeIPv6
		}
		sl.Ports = []discoveryv1.EndpointPort{{Name: &portName, Protocol: &p, Port: &targetPort}}
		zoneName := "zone-a"
		sl.Endpoints = []discoveryv1.Endpoint{
			{Addresses: []string{addr1, addr2}, Conditions: discoveryv1.EndpointConditions{Ready: bools(1), Serving: bools(2), Terminating: bools(4)},
				TargetRef: &corev1.ObjectReference{Name: name + "-1"}, Zone: &zoneName,
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}},
			{Addresses: []string{addr2}},
		}
		setAnnotation(&sl.Annotations, AnnotationSliceWeight, sliceWeight)
		checkIsolation(t, baseSvcs, baseSlices, manifestObjects{services: []*corev1.Service{svc}, slices: []*discoveryv1.EndpointSlice{sl}}, sameNamespace, zone, cond&16 != 0)
	})
}

// setAnnotation sets key to v, or leaves the map alone when v is empty.
func setAnnotation(m *map[string]string, key, v string) {
	if v == "" {
		return
	}
	if *m == nil {
		*m = map[string]string{}
	}
	(*m)[key] = v
}
