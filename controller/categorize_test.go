package controller

// Endpoint categories (kube-proxy's CategorizeEndpoints): which endpoints
// receive new connections for cluster-wide traffic and for Local traffic
// policies, with the serving-and-terminating fallback decided separately for
// each. The oracle is the rule as kube-proxy documents it, written out per
// case by hand: cluster endpoints are the ready ones (narrowed by topology),
// else every serving-and-terminating one; local endpoints are the ready local
// ones, else the serving-and-terminating local ones; the health check node
// port counts ready local endpoints only.
//
// IP plan as in build_test.go: Service 198.18.0.30, pods 198.19.30.<n>; this
// node is node-a in zone-a.

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// catEP is one endpoint of a categorisation case: pod name (also its last
// address byte through the case's order), condition, node, zone, zone hints.
type catEP struct {
	pod, cond, node, zone string
	hints                 []string
}

func TestCategorizeEndpoints(t *testing.T) {
	etpLocal := func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30030
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30931
	}
	itpLocal := func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	}
	td := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Spec.TrafficDistribution = ptr.To(v) }
	}
	cases := []struct {
		name string
		svc  func(*corev1.Service)
		eps  []catEP
		// cluster and local are the pods of ClusterBackends and
		// LocalBackends, sorted by address (the order of eps); local is
		// the Local category whether or not a policy uses it.
		cluster, local []string
		// health is the health check node port's count (ETP Local only).
		health int
	}{
		{
			name: "ETP Local: the only local endpoint terminates, a remote one is ready",
			svc:  etpLocal,
			eps: []catEP{
				{pod: "l-term", cond: condTerminating, node: "node-a"},
				{pod: "r-ready", cond: condReady, node: "node-b"},
			},
			cluster: []string{"r-ready"}, local: []string{"l-term"}, health: 0,
		},
		{
			name: "ITP Local: the only local endpoint terminates, a remote one is ready",
			svc:  itpLocal,
			eps: []catEP{
				{pod: "l-term", cond: condTerminating, node: "node-a"},
				{pod: "r-ready", cond: condReady, node: "node-b"},
			},
			cluster: []string{"r-ready"}, local: []string{"l-term"},
		},
		{
			name: "a ready local endpoint wins over a terminating local one",
			svc:  etpLocal,
			eps: []catEP{
				{pod: "l-ready", cond: condReady, node: "node-a"},
				{pod: "l-term", cond: condTerminating, node: "node-a"},
				{pod: "r-term", cond: condTerminating, node: "node-b"},
			},
			cluster: []string{"l-ready"}, local: []string{"l-ready"}, health: 1,
		},
		{
			name: "nothing ready anywhere: both categories fall back, the health check says 0",
			svc:  etpLocal,
			eps: []catEP{
				{pod: "l-term", cond: condTerminating, node: "node-a"},
				{pod: "r-term", cond: condTerminating, node: "node-b"},
				{pod: "r-gone", cond: condGone, node: "node-b"},
			},
			cluster: []string{"l-term", "r-term"}, local: []string{"l-term"}, health: 0,
		},
		{
			name: "a local endpoint that stopped serving is no fallback",
			svc:  etpLocal,
			eps: []catEP{
				{pod: "l-gone", cond: condGone, node: "node-a"},
				{pod: "r-ready", cond: condReady, node: "node-b"},
			},
			cluster: []string{"r-ready"}, local: nil, health: 0,
		},
		{
			name: "hints narrow cluster traffic to the zone, Local ignores them",
			svc:  etpLocal,
			eps: []catEP{
				{pod: "l-ready", cond: condReady, node: "node-a", zone: "zone-a", hints: []string{"zone-b"}},
				{pod: "a-ready", cond: condReady, node: "node-c", zone: "zone-a", hints: []string{"zone-a"}},
				{pod: "b-ready", cond: condReady, node: "node-b", zone: "zone-b", hints: []string{"zone-b"}},
			},
			cluster: []string{"a-ready"}, local: []string{"l-ready"}, health: 1,
		},
		{
			name: "hints are read from ready endpoints only: one without hints that is not ready does not turn topology off",
			svc:  nil,
			eps: []catEP{
				{pod: "a-ready", cond: condReady, node: "node-c", zone: "zone-a", hints: []string{"zone-a"}},
				{pod: "b-ready", cond: condReady, node: "node-b", zone: "zone-b", hints: []string{"zone-b"}},
				{pod: "b-term", cond: condTerminating, node: "node-b", zone: "zone-b"},
			},
			cluster: []string{"a-ready"},
		},
		{
			name: "nothing ready: the terminating fallback ignores topology",
			svc:  nil,
			eps: []catEP{
				{pod: "a-term", cond: condTerminating, node: "node-c", zone: "zone-a", hints: []string{"zone-a"}},
				{pod: "b-term", cond: condTerminating, node: "node-b", zone: "zone-b", hints: []string{"zone-b"}},
			},
			cluster: []string{"a-term", "b-term"},
		},
		{
			name: "PreferSameZone: the zone's ready endpoint, not the zone's terminating one",
			svc:  td(corev1.ServiceTrafficDistributionPreferSameZone),
			eps: []catEP{
				{pod: "a-term", cond: condTerminating, node: "node-c", zone: "zone-a"},
				{pod: "b-ready", cond: condReady, node: "node-b", zone: "zone-b"},
			},
			cluster: []string{"b-ready"},
		},
		{
			name: "PreferSameNode: this node's ready endpoint; Local falls back on its own",
			svc:  all(td(corev1.ServiceTrafficDistributionPreferSameNode), itpLocal),
			eps: []catEP{
				{pod: "l-term", cond: condTerminating, node: "node-a", zone: "zone-a"},
				{pod: "a-ready", cond: condReady, node: "node-c", zone: "zone-a"},
				{pod: "b-ready", cond: condReady, node: "node-b", zone: "zone-b"},
			},
			cluster: []string{"a-ready"}, local: []string{"l-term"},
		},
		{
			name: "PreferSameNode: a terminating local endpoint does not keep cluster traffic on the node",
			svc:  td(corev1.ServiceTrafficDistributionPreferSameNode),
			eps: []catEP{
				{pod: "l-term", cond: condTerminating, node: "node-a", zone: "zone-a"},
				{pod: "l-ready", cond: condReady, node: "node-a", zone: "zone-a"},
				{pod: "b-ready", cond: condReady, node: "node-b", zone: "zone-b"},
			},
			cluster: []string{"l-ready"}, local: []string{"l-ready"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var eps []discoveryv1.Endpoint
			for i, e := range c.eps {
				ep := endpoint(fmt.Sprintf("198.19.30.%d", i+1), e.pod, e.cond)
				ep.NodeName = ptr.To(e.node)
				if e.zone != "" {
					ep.Zone = ptr.To(e.zone)
				}
				if len(e.hints) > 0 {
					ep.Hints = &discoveryv1.EndpointHints{}
					for _, z := range e.hints {
						ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
					}
				}
				eps = append(eps, ep)
			}
			svc := makeService("demo", "cat", all(withIP("198.18.0.30"), func(s *corev1.Service) {
				if c.svc != nil {
					c.svc(s)
				}
			}))
			b := NewBuilder()
			b.NodeName, b.Zone = "node-a", "zone-a"
			st, problems := b.Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{makeSlice("demo", "cat", "cat-1", eps, nil)})
			if len(problems) > 0 || len(st.Services) != 1 {
				t.Fatalf("problems %v, %d ports", problemStrings(problems), len(st.Services))
			}
			sp := &st.Services[0]
			var cluster, local []string
			for _, be := range sp.ClusterBackends() {
				cluster = append(cluster, be.Name)
			}
			for _, be := range sp.LocalBackends() {
				local = append(local, be.Name)
			}
			if !slices.Equal(cluster, c.cluster) {
				t.Errorf("cluster endpoints %v, want %v", cluster, c.cluster)
			}
			if !slices.Equal(local, c.local) {
				t.Errorf("local endpoints %v, want %v", local, c.local)
			}
			if sp.HealthCheckNodePort != 0 {
				if got := HealthCheckCounts(st)[sp.HealthCheckNodePort].LocalEndpoints; got != c.health {
					t.Errorf("health check counts %d local endpoints, want %d (ready local ones)", got, c.health)
				}
			}
		})
	}
}

// A split target whose local endpoint terminates while a remote one is
// ready: that endpoint is LocalOnly, and leaves the split's cluster
// arithmetic alone (part * w / sum over the cluster endpoints), so cluster
// traffic still gives each target its part: stable 90 to s-2, canary 10.
func TestCategorizeSplitKeepsParts(t *testing.T) {
	const ns = "demo"
	services := []*corev1.Service{
		makeService(ns, "web", all(withIP("198.18.0.31"), withAnnotation(AnnotationSplit, "web-stable=90,web-canary=10"))),
		makeService(ns, "web-stable", withIP("198.18.0.32")),
		makeService(ns, "web-canary", withIP("198.18.0.33")),
	}
	onA := func(ep discoveryv1.Endpoint, node string) discoveryv1.Endpoint { ep.NodeName = ptr.To(node); return ep }
	sls := []*discoveryv1.EndpointSlice{
		makeSlice(ns, "web-stable", "s", []discoveryv1.Endpoint{
			onA(endpoint("198.19.31.1", "s-1", condTerminating), "node-a"),
			onA(ready("198.19.31.2", "s-2"), "node-b"),
		}, nil),
		makeSlice(ns, "web-canary", "c", []discoveryv1.Endpoint{onA(ready("198.19.31.3", "c-1"), "node-b")}, nil),
	}
	b := NewBuilder()
	b.NodeName = "node-a"
	st, problems := b.Build(services, sls)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problemStrings(problems))
	}
	sp := byName(st)["demo/web:http"]
	got := map[string]float64{}
	for _, be := range sp.ClusterBackends() {
		got[be.Name] = be.Weight
	}
	if want := map[string]float64{"s-2": 90, "c-1": 10}; len(got) != 2 || got["s-2"] != want["s-2"] || got["c-1"] != want["c-1"] {
		t.Errorf("cluster weights %v, want %v", got, want)
	}
	if local := sp.LocalBackends(); len(local) != 1 || local[0].Name != "s-1" || !local[0].LocalOnly {
		t.Errorf("local endpoints %+v, want s-1 only, LocalOnly", local)
	}
}
