package gateway

import (
	"math"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
)

const ns = "demo"

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func objMeta(name string, age int) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second))}
}

func svc(name, vip string, ann map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: corev1.ServiceSpec{ClusterIP: vip, Ports: []corev1.ServicePort{
			{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP},
			{Name: "udp", Port: 80, Protocol: corev1.ProtocolUDP},
		}},
	}
}

func slice(svcName string, pods map[string]string) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svcName + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("tcp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("udp"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolUDP)},
		},
	}
	for pod, ip := range pods {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, TargetRef: &corev1.ObjectReference{Name: pod}})
	}
	return sl
}

func backendRef(name string, w int32) gwv1.BackendRef {
	return gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(name), Port: ptr.To[gwv1.PortNumber](80)}, Weight: ptr.To(w)}
}

func class() *gwv1.GatewayClass {
	return &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "steelyard"}, Spec: gwv1.GatewayClassSpec{ControllerName: ControllerName}}
}

func gw(name string, age int, ls ...gwv1.Listener) *gwv1.Gateway {
	return &gwv1.Gateway{ObjectMeta: objMeta(name, age), Spec: gwv1.GatewaySpec{GatewayClassName: "steelyard", Listeners: ls}}
}

func tcpRoute(name string, age int, parent gwv1.ParentReference, refs ...gwv1.BackendRef) *gwv1.TCPRoute {
	return &gwv1.TCPRoute{ObjectMeta: objMeta(name, age), Spec: gwv1.TCPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent}},
		Rules:           []gwv1.TCPRouteRule{{BackendRefs: refs}},
	}}
}

// shares returns backend IP -> percent of one Service port: the oracle is
// the definition (Weight / sum), not the dataplane code.
func shares(t *testing.T, st dataplane.State, name string) map[string]float64 {
	t.Helper()
	for _, sp := range st.Services {
		if sp.Name.String() == name {
			out := map[string]float64{}
			sum := sp.TotalWeight()
			for _, b := range sp.Active() {
				out[b.IP.String()] = 100 * b.Weight / sum
			}
			return out
		}
	}
	t.Fatalf("no Service port %s in %+v", name, st.Services)
	return nil
}

func sameShares(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: shares %v, want %v", what, got, want)
		return
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-9 {
			t.Errorf("%s: shares %v, want %v", what, got, want)
			return
		}
	}
}

func condOf(t *testing.T, cs []metav1.Condition, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(cs, typ)
	if c == nil {
		t.Fatalf("no condition %s in %+v", typ, cs)
	}
	return *c
}

// TestListenerRouteShares: backendRef weights across Services, endpoint
// weights inside each, weight 0, and the address from the pool.
func TestListenerRouteShares(t *testing.T) {
	svcs := []*corev1.Service{
		svc("s1", "198.18.0.10", map[string]string{controller.AnnotationWeights: "a=1,b=3"}),
		svc("s2", "198.18.0.11", nil),
		svc("s3", "198.18.0.12", nil),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("s1", map[string]string{"a": "198.19.1.2", "b": "198.19.1.3"}),
		slice("s2", map[string]string{"c": "198.19.1.4"}),
		slice("s3", map[string]string{"d": "198.19.1.5"}),
	}
	in := Input{
		Classes:   []*gwv1.GatewayClass{class()},
		Gateways:  []*gwv1.Gateway{gw("gw", 0, gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000})},
		TCPRoutes: []*gwv1.TCPRoute{tcpRoute("web", 0, gwv1.ParentReference{Name: "gw"}, backendRef("s1", 80), backendRef("s2", 20), backendRef("s3", 0))},
		Services:  svcs,
		Pool:      netip.MustParsePrefix("198.18.200.0/28"),
	}
	res := Translate(in)
	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, problems := b.Build(svcs, slices)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	name := "demo/gw:tcp/TCPRoute/demo/web"
	sameShares(t, name, shares(t, st, name), map[string]float64{"198.19.1.2": 20, "198.19.1.3": 60, "198.19.1.4": 20})
	for _, sp := range st.Services {
		if sp.Name.String() == name && sp.VIP != (dataplane.VIP{IP: netip.MustParseAddr("198.18.200.1"), Port: 9000, Protocol: dataplane.TCP}) {
			t.Errorf("listener VIP %s, want 198.18.200.1:9000/TCP", sp.VIP)
		}
	}
	gs := res.Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	if len(gs.Addresses) != 1 || gs.Addresses[0].Value != "198.18.200.1" {
		t.Errorf("status.addresses %+v", gs.Addresses)
	}
	if c := condOf(t, gs.Conditions, "Programmed"); c.Status != metav1.ConditionTrue {
		t.Errorf("Programmed %+v", c)
	}
	if gs.Listeners[0].AttachedRoutes != 1 {
		t.Errorf("attachedRoutes %d", gs.Listeners[0].AttachedRoutes)
	}
	ps := res.RouteParents["TCPRoute/demo/web"]
	if len(ps) != 1 || condOf(t, ps[0].Conditions, "Accepted").Status != metav1.ConditionTrue || condOf(t, ps[0].Conditions, "ResolvedRefs").Status != metav1.ConditionTrue {
		t.Errorf("route status %+v", ps)
	}
}

// TestServiceParentWinsOverSplit: GAMMA on one port; the annotation keeps
// the other port and a Problem says the route wins.
func TestServiceParentWinsOverSplit(t *testing.T) {
	svcs := []*corev1.Service{
		svc("s1", "198.18.0.10", nil), svc("s2", "198.18.0.11", nil),
		svc("front", "198.18.0.12", map[string]string{controller.AnnotationSplit: "s1=50,s2=50"}),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("s1", map[string]string{"a": "198.19.1.2"}),
		slice("s2", map[string]string{"c": "198.19.1.4"}),
	}
	parent := gwv1.ParentReference{Group: ptr.To(gwv1.Group("")), Kind: ptr.To(gwv1.Kind("Service")), Name: "front", Port: ptr.To[gwv1.PortNumber](80)}
	in := Input{TCPRoutes: []*gwv1.TCPRoute{tcpRoute("canary", 0, parent, backendRef("s1", 9), backendRef("s2", 1))}, Services: svcs}
	res := Translate(in)
	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, problems := b.Build(svcs, slices)
	sameShares(t, "tcp", shares(t, st, "demo/front:tcp/TCPRoute/demo/canary"), map[string]float64{"198.19.1.2": 90, "198.19.1.4": 10})
	sameShares(t, "udp", shares(t, st, "demo/front:udp"), map[string]float64{"198.19.1.2": 50, "198.19.1.4": 50})
	if len(problems) != 1 || problems[0].Annotation != controller.AnnotationSplit {
		t.Errorf("problems %v, want one about the split annotation", problems)
	}
	if c := condOf(t, res.RouteParents["TCPRoute/demo/canary"][0].Conditions, "Accepted"); c.Status != metav1.ConditionTrue {
		t.Errorf("Accepted %+v", c)
	}
}

// TestRouteStatusReasons: the spec's reasons, each on its own route, and
// the good route still built.
func TestRouteStatusReasons(t *testing.T) {
	other := svc("remote", "198.18.0.20", nil)
	other.Namespace = "other"
	svcs := []*corev1.Service{svc("s1", "198.18.0.10", nil), other}
	kindRef := backendRef("s1", 1)
	kindRef.Kind = ptr.To(gwv1.Kind("ConfigMap"))
	crossRef := backendRef("remote", 1)
	crossRef.Namespace = ptr.To(gwv1.Namespace("other"))
	stranger := tcpRoute("stranger", 5, gwv1.ParentReference{Name: "gw", Namespace: ptr.To(gwv1.Namespace(ns))}, backendRef("s1", 1))
	stranger.Namespace = "other"
	in := Input{
		Classes: []*gwv1.GatewayClass{class()},
		Gateways: []*gwv1.Gateway{gw("gw", 0,
			gwv1.Listener{Name: "a", Protocol: gwv1.TCPProtocolType, Port: 1},
			gwv1.Listener{Name: "b", Protocol: gwv1.TCPProtocolType, Port: 2},
			gwv1.Listener{Name: "c", Protocol: gwv1.TCPProtocolType, Port: 3},
			gwv1.Listener{Name: "h", Protocol: gwv1.HTTPSProtocolType, Port: 4})},
		TCPRoutes: []*gwv1.TCPRoute{
			tcpRoute("good", 0, gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("a"))}, backendRef("s1", 1)),
			tcpRoute("missing", 1, gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("b"))}, backendRef("nope", 1)),
			tcpRoute("kind", 2, gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("b"))}, kindRef),
			tcpRoute("cross", 3, gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("c"))}, crossRef),
			tcpRoute("nosection", 4, gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("z"))}, backendRef("s1", 1)),
			stranger,
		},
		Services: svcs,
		Pool:     netip.MustParsePrefix("198.18.200.0/30"),
	}
	res := Translate(in)
	for _, c := range []struct{ route, typ, status, reason string }{
		{"TCPRoute/demo/good", "ResolvedRefs", "True", "ResolvedRefs"},
		{"TCPRoute/demo/missing", "ResolvedRefs", "False", "BackendNotFound"},
		{"TCPRoute/demo/kind", "ResolvedRefs", "False", "InvalidKind"},
		{"TCPRoute/demo/cross", "ResolvedRefs", "False", "RefNotPermitted"},
		{"TCPRoute/demo/nosection", "Accepted", "False", "NoMatchingParent"},
		{"TCPRoute/other/stranger", "Accepted", "False", "NotAllowedByListeners"},
	} {
		ps := res.RouteParents[c.route]
		if len(ps) != 1 {
			t.Errorf("%s: parents %+v", c.route, ps)
			continue
		}
		got := condOf(t, ps[0].Conditions, c.typ)
		if string(got.Status) != c.status || got.Reason != c.reason {
			t.Errorf("%s: %s=%s %s (%s), want %s %s", c.route, c.typ, got.Status, got.Reason, got.Message, c.status, c.reason)
		}
	}
	gs := res.Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	if gs.Addresses[0].Value != "198.18.200.1" {
		t.Errorf("a /30 pool gives .1 first (not the network address): %+v", gs.Addresses)
	}
	if c := condOf(t, gs.Listeners[3].Conditions, "Accepted"); c.Reason != "UnsupportedProtocol" {
		t.Errorf("HTTPS listener (no TLS yet) %+v", c)
	}

	// With a ReferenceGrant the cross-namespace ref resolves.
	in.Grants = []*gwv1.ReferenceGrant{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "g"},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: "TCPRoute", Namespace: ns}},
			To:   []gwv1.ReferenceGrantTo{{Kind: "Service"}},
		},
	}}
	res = Translate(in)
	if c := condOf(t, res.RouteParents["TCPRoute/demo/cross"][0].Conditions, "ResolvedRefs"); c.Status != metav1.ConditionTrue {
		t.Errorf("cross with a grant: %+v", c)
	}
	// The good route is built whatever the others do.
	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, _ := b.Build(svcs, []*discoveryv1.EndpointSlice{slice("s1", map[string]string{"a": "198.19.1.2"})})
	sameShares(t, "good", shares(t, st, "demo/gw:a/TCPRoute/demo/good"), map[string]float64{"198.19.1.2": 100})
}

// TestPoolAssignmentStable: a Gateway keeps the pool address its status
// holds when an older Gateway comes later; an exhausted pool leaves the
// newest without an address and Programmed False.
func TestPoolAssignmentStable(t *testing.T) {
	l := gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 80}
	young := gw("young", 10, l)
	young.Status.Addresses = []gwv1.GatewayStatusAddress{{Value: "198.18.200.1"}}
	old := gw("old", 0, l)
	third := gw("third", 20, l)
	res := Translate(Input{Classes: []*gwv1.GatewayClass{class()}, Gateways: []*gwv1.Gateway{young, old, third}, Pool: netip.MustParsePrefix("198.18.200.0/30")})
	get := func(n string) gwv1.GatewayStatus { return res.Gateways[types.NamespacedName{Namespace: ns, Name: n}] }
	if a := get("young").Addresses; len(a) != 1 || a[0].Value != "198.18.200.1" {
		t.Errorf("young %+v, want to keep .1", a)
	}
	if a := get("old").Addresses; len(a) != 1 || a[0].Value != "198.18.200.2" {
		t.Errorf("old %+v, want .2", a)
	}
	if a := get("third").Addresses; len(a) != 0 {
		t.Errorf("third %+v, want none (.3 is the broadcast address)", a)
	}
	if c := condOf(t, get("third").Conditions, "Programmed"); c.Reason != "AddressNotAssigned" {
		t.Errorf("third Programmed %+v", c)
	}
}

// TestMergeConditionsKeepsTransitionTime: an unchanged status keeps its
// lastTransitionTime, so repeated writes are no-ops.
func TestMergeConditionsKeepsTransitionTime(t *testing.T) {
	then, now := metav1.NewTime(t0), metav1.NewTime(t0.Add(time.Hour))
	prev := []metav1.Condition{{Type: "Accepted", Status: metav1.ConditionTrue, LastTransitionTime: then}}
	got := mergeConditions(prev, []metav1.Condition{
		{Type: "Accepted", Status: metav1.ConditionTrue},
		{Type: "Programmed", Status: metav1.ConditionFalse},
	}, now)
	if !got[0].LastTransitionTime.Equal(&then) || !got[1].LastTransitionTime.Equal(&now) {
		t.Errorf("got %+v", got)
	}
	// Other controllers' parents stay; ours are replaced.
	theirs := gwv1.RouteParentStatus{ControllerName: "example.com/other", ParentRef: gwv1.ParentReference{Name: "x"}}
	out, changed := routeParents([]gwv1.RouteParentStatus{theirs}, nil, now)
	if changed || len(out) != 1 {
		t.Errorf("routeParents kept %+v changed %v", out, changed)
	}
}

// TestRelevantUpdate: our own status writes do not trigger a sync; spec,
// label and held-address changes do.
func TestRelevantUpdate(t *testing.T) {
	r := tcpRoute("web", 0, gwv1.ParentReference{Name: "gw"})
	r2 := r.DeepCopy()
	r2.ResourceVersion = "2"
	r2.Status.Parents = []gwv1.RouteParentStatus{{ControllerName: ControllerName}}
	if relevantUpdate(r, r2) {
		t.Error("a status-only TCPRoute update counts as relevant")
	}
	r2.Generation = 2
	if !relevantUpdate(r, r2) {
		t.Error("a spec change (new generation) is not relevant")
	}
	g := gw("gw", 0)
	g2 := g.DeepCopy()
	g2.Status.Conditions = []metav1.Condition{{Type: "Accepted"}}
	if relevantUpdate(g, g2) {
		t.Error("a Gateway condition write counts as relevant")
	}
	g2.Status.Addresses = []gwv1.GatewayStatusAddress{{Value: "198.18.200.1"}}
	if !relevantUpdate(g, g2) {
		t.Error("a change of the held address is not relevant")
	}
}

// TestSpecAddresses: spec.addresses are used as written and kept out of
// the pool; a Hostname address is refused with UnsupportedAddress.
func TestSpecAddresses(t *testing.T) {
	l := gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 80}
	fixed := gw("fixed", 5, l)
	fixed.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: ptr.To(gwv1.IPAddressType), Value: "198.18.200.1"}}
	named := gw("named", 0, l)
	named.Spec.Addresses = []gwv1.GatewaySpecAddress{{Type: ptr.To(gwv1.HostnameAddressType), Value: "lb.example"}}
	pooled := gw("pooled", 10, l)
	res := Translate(Input{Classes: []*gwv1.GatewayClass{class()}, Gateways: []*gwv1.Gateway{fixed, named, pooled}, Pool: netip.MustParsePrefix("198.18.200.0/29")})
	get := func(n string) gwv1.GatewayStatus { return res.Gateways[types.NamespacedName{Namespace: ns, Name: n}] }
	if a := get("fixed").Addresses; len(a) != 1 || a[0].Value != "198.18.200.1" {
		t.Errorf("fixed %+v", a)
	}
	if a := get("pooled").Addresses; len(a) != 1 || a[0].Value != "198.18.200.2" {
		t.Errorf("pooled %+v, want .2 (.1 is fixed's)", a)
	}
	if c := condOf(t, get("named").Conditions, "Accepted"); c.Reason != "UnsupportedAddress" || c.Status != metav1.ConditionFalse {
		t.Errorf("named Accepted %+v", c)
	}
	if len(res.Routes.Listeners) != 0 {
		t.Errorf("listeners without routes became Service ports: %+v", res.Routes.Listeners)
	}
}

// TestGatewayAcceptedListenersNotValid: a Gateway with a TCP listener and
// a TLS one (unsupported) is Accepted with reason ListenersNotValid, as the
// conformance test GatewayListenerUnsupportedProtocol wants; the TLS
// listener is not accepted and the TCP one is.
func TestGatewayAcceptedListenersNotValid(t *testing.T) {
	res := Translate(Input{
		Classes: []*gwv1.GatewayClass{class()},
		Gateways: []*gwv1.Gateway{gw("gw", 0,
			gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000},
			gwv1.Listener{Name: "tls", Protocol: gwv1.TLSProtocolType, Port: 9443})},
		Pool: netip.MustParsePrefix("198.18.200.0/28"),
	})
	gs := res.Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	if c := condOf(t, gs.Conditions, "Accepted"); c.Status != metav1.ConditionTrue || c.Reason != "ListenersNotValid" {
		t.Errorf("Gateway Accepted %s/%s, want True/ListenersNotValid", c.Status, c.Reason)
	}
	for i, want := range []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse} {
		if c := condOf(t, gs.Listeners[i].Conditions, "Accepted"); c.Status != want {
			t.Errorf("listener %s Accepted %s, want %s", gs.Listeners[i].Name, c.Status, want)
		}
	}
}
