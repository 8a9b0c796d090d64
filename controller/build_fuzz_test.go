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
		baseNames := map[[2]string]bool{}
		for _, s := range baseSvcs {
			baseNames[[2]string{s.Namespace, s.Name}] = true
		}
		random := map[[2]string]bool{}
		for _, s := range objs.services {
			if !sameNamespace {
				s.Namespace = "fuzz"
			}
			setAnnotation(&s.Annotations, AnnotationWeights, weights)
			setAnnotation(&s.Annotations, AnnotationSplit, split)
			if k := [2]string{s.Namespace, s.Name}; !baseNames[k] {
				random[k] = true
			}
		}
		legit := false
		for _, sl := range objs.slices {
			if !sameNamespace {
				sl.Namespace = "fuzz"
			}
			setAnnotation(&sl.Annotations, AnnotationSliceWeight, sliceWeight)
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
