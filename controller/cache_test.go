package controller

// Test IP plan: VIPs 198.18.0.1 .. 198.18.0.6 (few, so that Services
// sometimes share one), endpoints 198.19.1.1 .. 198.19.1.8, Gateway
// listener VIPs 198.18.9.1 .. 198.18.9.2.

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/dataplane"
)

// world is the objects of one step of the random sequence.
type world struct {
	svcs   map[types.NamespacedName]*corev1.Service
	slices map[types.NamespacedName]*discoveryv1.EndpointSlice
}

var (
	propNamespaces = []string{"a", "b"}
	propServices   = []string{"s0", "s1", "s2", "s3"}
	propSlices     = []string{"x", "y", "z"}
	propZones      = []string{"", "z1", "z2"}
)

// randomService is a Service named n with random spec and annotations,
// valid and invalid; uid picks one of two incarnations (a recreated
// Service is a new object).
func randomService(r *rand.Rand, n types.NamespacedName) *corev1.Service {
	svc := makeService(n.Namespace, n.Name, nil)
	svc.UID = types.UID(fmt.Sprintf("%s/%s/%d", n.Namespace, n.Name, r.Intn(2)))
	svc.Spec.ClusterIP = fmt.Sprintf("198.18.0.%d", 1+r.Intn(6))
	switch r.Intn(10) {
	case 0:
		svc.Spec.ClusterIP = corev1.ClusterIPNone
	case 1:
		svc.Spec.ClusterIP = "not-an-ip"
	}
	svc.Spec.Ports = nil
	for i, name := range []string{"http", "dns"} {
		if r.Intn(3) == 0 {
			continue
		}
		proto := corev1.ProtocolTCP
		if r.Intn(3) == 0 {
			proto = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: name, Port: int32(80 + i), Protocol: proto, NodePort: int32(30000 + r.Intn(3))})
	}
	switch r.Intn(3) {
	case 1:
		svc.Spec.Type = corev1.ServiceTypeNodePort
	case 2:
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.8.1"}}
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = 32000
	}
	if r.Intn(3) == 0 {
		svc.Spec.TrafficDistribution = ptr.To(corev1.ServiceTrafficDistributionPreferClose)
	}
	pick := func(vals ...string) string { return vals[r.Intn(len(vals))] }
	if r.Intn(2) == 0 {
		annotate(&svc.ObjectMeta, AnnotationWeights, pick("p1=3,p2=1", "*=2", "p3=0", "p1=x", "198.19.1.2=7"))
	}
	if r.Intn(3) == 0 {
		annotate(&svc.ObjectMeta, AnnotationSplit, pick("s0=1,s1=3", "s2=1", "s3=2,s0=1", "s1=2,"+n.Name+"=1", "bad split"))
	}
	if r.Intn(4) == 0 {
		annotate(&svc.ObjectMeta, AnnotationScheduler, pick("rr", "wrr", "nonsense"))
	}
	return svc
}

// randomSlice is a slice named n with random endpoints for a random
// Service of its namespace (or none).
func randomSlice(r *rand.Rand, n types.NamespacedName) *discoveryv1.EndpointSlice {
	conds := []string{condReady, condReady, condNotReady, condTerminating, condGone, condUnknown}
	var eps []discoveryv1.Endpoint
	for i := r.Intn(4); i > 0; i-- {
		k := 1 + r.Intn(8)
		ep := endpoint(fmt.Sprintf("198.19.1.%d", k), fmt.Sprintf("p%d", k), conds[r.Intn(len(conds))])
		if r.Intn(2) == 0 {
			var hints []string
			if r.Intn(2) == 0 {
				hints = []string{propZones[1+r.Intn(2)]}
			}
			ep = onNode(ep, []string{"node-a", "node-b"}[r.Intn(2)], propZones[1+r.Intn(2)], hints...)
		}
		eps = append(eps, ep)
	}
	svc := propServices[r.Intn(len(propServices))]
	if r.Intn(8) == 0 {
		svc = ""
	}
	sl := makeSlice(n.Namespace, svc, n.Name, eps, nil)
	sl.UID = types.UID(fmt.Sprintf("%s/slice/%s/%d", n.Namespace, n.Name, r.Intn(2)))
	if svc == "" {
		delete(sl.Labels, discoveryv1.LabelServiceName)
	}
	if r.Intn(3) == 0 {
		sl.Ports = append(sl.Ports, slicePortOf("dns", 5353, corev1.ProtocolUDP))
	}
	switch r.Intn(5) {
	case 0:
		annotate(&sl.ObjectMeta, AnnotationSliceWeight, []string{"5", "x"}[r.Intn(2)])
	case 1:
		annotate(&sl.ObjectMeta, AnnotationCiliumWeight, []string{"2", "-1"}[r.Intn(2)])
	}
	return sl
}

// randomRoutes are Gateway routes over the Services, or none.
func randomRoutes(r *rand.Rand) Routes {
	var rt Routes
	if r.Intn(2) == 0 {
		return rt
	}
	ref := func() RouteBackend {
		return RouteBackend{Namespace: "a", Service: propServices[r.Intn(len(propServices))], Port: int32(80 + r.Intn(2)), Weight: uint32(1 + r.Intn(3)), Invalid: r.Intn(6) == 0}
	}
	for i := r.Intn(3); i > 0; i-- {
		rt.Services = append(rt.Services, ServiceRoute{
			Service: types.NamespacedName{Namespace: "a", Name: propServices[r.Intn(len(propServices))]}, Port: int32(80 * r.Intn(2)),
			Protocol: dataplane.TCP, Route: "TCPRoute/a/r" + fmt.Sprint(i), Backends: []RouteBackend{ref(), ref()},
		})
	}
	if r.Intn(2) == 0 {
		rt.Listeners = append(rt.Listeners, ListenerRoute{
			Name:     dataplane.ServicePortName{Namespace: "a", Name: "gw", Port: "tcp/TCPRoute/a/l"},
			VIP:      dataplane.VIP{IP: netip.MustParseAddr("198.18.9.1"), Port: 9000, Protocol: dataplane.TCP},
			Backends: []RouteBackend{ref()},
		})
	}
	return rt
}

// TestIncrementalEqualsFullBuild is the oracle of the cache: a random
// sequence of object changes (Services and slices added, changed,
// recreated and deleted, annotations made valid and invalid, the zone and
// the routes changed), applied to one Builder with Update and to another
// with a Build of every object after every step. Both must give the same
// State and problems at every step, and Update's changed set must name
// every Service whose ports differ from the previous step's.
func TestIncrementalEqualsFullBuild(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		r := rand.New(rand.NewSource(seed))
		w := world{svcs: map[types.NamespacedName]*corev1.Service{}, slices: map[types.NamespacedName]*discoveryv1.EndpointSlice{}}
		inc, full := NewBuilder(), NewBuilder()
		inc.NodeName, full.NodeName = "node-a", "node-a"
		var prev dataplane.State
		for step := 0; step < 80; step++ {
			var changes []ObjectChange
			for i := 1 + r.Intn(3); i > 0; i-- {
				ns := propNamespaces[r.Intn(len(propNamespaces))]
				if r.Intn(2) == 0 {
					n := types.NamespacedName{Namespace: ns, Name: propServices[r.Intn(len(propServices))]}
					var obj *corev1.Service
					if r.Intn(5) > 0 {
						obj = randomService(r, n)
						w.svcs[n] = obj
					} else {
						delete(w.svcs, n)
					}
					changes = append(changes, ObjectChange{Kind: KindService, Name: n, Object: nilIfNil(obj)})
				} else {
					n := types.NamespacedName{Namespace: ns, Name: propSlices[r.Intn(len(propSlices))]}
					var obj *discoveryv1.EndpointSlice
					if r.Intn(5) > 0 {
						obj = randomSlice(r, n)
						w.slices[n] = obj
					} else {
						delete(w.slices, n)
					}
					changes = append(changes, ObjectChange{Kind: KindEndpointSlice, Name: n, Object: nilIfNil(obj)})
				}
			}
			// The tracker hands over one change per object: its state now.
			changes = lastPerObject(changes)
			if r.Intn(15) == 0 {
				z := propZones[r.Intn(len(propZones))]
				inc.Zone, full.Zone = z, z
			}
			if r.Intn(6) == 0 {
				rt := randomRoutes(r)
				inc.SetRoutes(rt)
				full.SetRoutes(rt)
			}
			var got dataplane.State
			var gotProblems []Problem
			var changed map[dataplane.ServiceName]bool
			if step == 0 {
				got, gotProblems = inc.Build(w.list())
			} else {
				got, gotProblems, changed = inc.Update(changes)
			}
			want, wantProblems := full.Build(w.list())
			where := fmt.Sprintf("seed %d step %d", seed, step)
			if d := stateDiff(got, want); d != "" {
				t.Fatalf("%s: incremental != full build:\n%s\nobjects:\n%s", where, d, w.dump())
			}
			if g, w := problemKeys(gotProblems), problemKeys(wantProblems); !slices.Equal(g, w) {
				t.Fatalf("%s: problems\n got %q\nwant %q", where, g, w)
			}
			if step > 0 && changed != nil {
				for n := range servicesThatDiffer(prev, want) {
					// Listener ports are the agent's to name (routes).
					if !changed[n] && n.Name != "gw" {
						t.Fatalf("%s: %s changed but is not in the changed set %v", where, n, changed)
					}
				}
			}
			prev = want
		}
	}
}

// lastPerObject keeps the last change of each object, in order.
func lastPerObject(cs []ObjectChange) []ObjectChange {
	last := map[objectKey]int{}
	for i, c := range cs {
		last[objectKey{c.Kind, c.Name}] = i
	}
	var out []ObjectChange
	for i, c := range cs {
		if last[objectKey{c.Kind, c.Name}] == i {
			out = append(out, c)
		}
	}
	return out
}

func (w world) dump() string {
	var out []string
	for n, s := range w.svcs {
		out = append(out, fmt.Sprintf("svc %s uid %s ip %s ports %+v ann %v", n, s.UID, s.Spec.ClusterIP, s.Spec.Ports, s.Annotations))
	}
	for n, s := range w.slices {
		out = append(out, fmt.Sprintf("slice %s uid %s labels %v ann %v eps %d", n, s.UID, s.Labels, s.Annotations, len(s.Endpoints)))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

func (w world) list() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var svcs []*corev1.Service
	for _, s := range w.svcs {
		svcs = append(svcs, s)
	}
	var sls []*discoveryv1.EndpointSlice
	for _, s := range w.slices {
		sls = append(sls, s)
	}
	return svcs, sls
}

// stateDiff describes how two States differ ("" when equal).
func stateDiff(a, b dataplane.State) string {
	var out []string
	if len(a.Services) != len(b.Services) {
		out = append(out, fmt.Sprintf("%d ports, want %d", len(a.Services), len(b.Services)))
	}
	for i := 0; i < len(a.Services) && i < len(b.Services); i++ {
		if !a.Services[i].Equal(&b.Services[i]) {
			out = append(out, fmt.Sprintf("port %d:\n got %+v\nwant %+v", i, a.Services[i], b.Services[i]))
		}
	}
	return strings.Join(out, "\n")
}

func problemKeys(ps []Problem) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.Kind+" "+p.Object+" "+p.Error())
	}
	return out
}

// servicesThatDiffer are the Services whose ports differ between a and b.
func servicesThatDiffer(a, b dataplane.State) map[dataplane.ServiceName]bool {
	group := func(s dataplane.State) map[dataplane.ServiceName][]dataplane.ServicePort {
		m := map[dataplane.ServiceName][]dataplane.ServicePort{}
		for _, sp := range s.Services {
			m[sp.Name.Service()] = append(m[sp.Name.Service()], sp)
		}
		return m
	}
	ga, gb := group(a), group(b)
	out := map[dataplane.ServiceName]bool{}
	for n, pa := range ga {
		if !slices.EqualFunc(pa, gb[n], func(x, y dataplane.ServicePort) bool { return x.Equal(&y) }) {
			out[n] = true
		}
	}
	for n := range gb {
		if _, ok := ga[n]; !ok {
			out[n] = true
		}
	}
	return out
}

// An endpoint change writes the Service's new ports into the last State's
// array (no copy of every port), and the result equals a full Build; a
// new Service, which moves the others, assembles a new array.
func TestUpdatePatchesInPlace(t *testing.T) {
	var svcs []*corev1.Service
	var sls []*discoveryv1.EndpointSlice
	for i, name := range []string{"a", "b", "c"} {
		svcs = append(svcs, makeService("demo", name, withIP(fmt.Sprintf("198.18.0.%d", i+1))))
		sls = append(sls, makeSlice("demo", name, name+"-1", []discoveryv1.Endpoint{ready(fmt.Sprintf("198.19.0.%d", i+1), name+"-0")}, nil))
	}
	b := NewBuilder()
	first, _ := b.Build(svcs, sls)
	// Service b's endpoint turns unready.
	sls[1] = makeSlice("demo", "b", "b-1", []discoveryv1.Endpoint{endpoint("198.19.0.2", "b-0", condNotReady)}, nil)
	got, _, changed := b.Update([]ObjectChange{{Kind: KindEndpointSlice, Name: types.NamespacedName{Namespace: "demo", Name: "b-1"}, Object: sls[1]}})
	if &got.Services[0] != &first.Services[0] {
		t.Error("an endpoint change copied the State instead of patching it")
	}
	if !changed[dataplane.ServiceName{Namespace: "demo", Name: "b"}] || len(changed) != 1 {
		t.Errorf("changed %v, want demo/b", changed)
	}
	want, _ := NewBuilder().Build(svcs, sls)
	if diff := stateDiff(got, want); diff != "" {
		t.Fatalf("patched State differs from a full Build:\n%s", diff)
	}
	// A new Service: the ports move, a new array.
	svcs = append(svcs, makeService("demo", "aa", withIP("198.18.0.9")))
	got2, _, _ := b.Update([]ObjectChange{{Kind: KindService, Name: types.NamespacedName{Namespace: "demo", Name: "aa"}, Object: svcs[3]}})
	if &got2.Services[0] == &got.Services[0] {
		t.Error("a new Service patched the State in place")
	}
	want, _ = NewBuilder().Build(svcs, sls)
	if diff := stateDiff(got2, want); diff != "" {
		t.Fatalf("State after a new Service differs from a full Build:\n%s", diff)
	}
}
