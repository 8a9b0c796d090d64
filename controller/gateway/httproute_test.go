package gateway

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller/ingress"
)

func httpRoute(name string, age int, hosts []gwv1.Hostname, parent gwv1.ParentReference, refs ...gwv1.BackendRef) *gwv1.HTTPRoute {
	var hrefs []gwv1.HTTPBackendRef
	for _, r := range refs {
		hrefs = append(hrefs, gwv1.HTTPBackendRef{BackendRef: r})
	}
	return &gwv1.HTTPRoute{ObjectMeta: objMeta(name, age), Spec: gwv1.HTTPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent}},
		Hostnames:       hosts,
		Rules:           []gwv1.HTTPRouteRule{{BackendRefs: hrefs}},
	}}
}

// TestHTTPRouteStatus: HTTP listeners accept HTTPRoutes with the same
// reasons as L4 routes, plus hostnames and the renderer's allow-list; the
// attached routes go to the nginx layer with their VIPs and weights.
func TestHTTPRouteStatus(t *testing.T) {
	web := gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("web"))}
	tcp := gwv1.ParentReference{Name: "gw", SectionName: ptr.To(gwv1.SectionName("tcp"))}
	cross := backendRef("s1", 1)
	cross.Namespace = ptr.To(gwv1.Namespace("other"))
	bad := httpRoute("inject", 5, nil, web, backendRef("s1", 1))
	bad.Spec.Rules[0].Matches = []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A", Value: `a"; return 200 "x`}}}}
	in := Input{
		Classes: []*gwv1.GatewayClass{class()},
		Gateways: []*gwv1.Gateway{gw("gw", 0,
			gwv1.Listener{Name: "web", Protocol: gwv1.HTTPProtocolType, Port: 8080, Hostname: ptr.To(gwv1.Hostname("*.example.com"))},
			gwv1.Listener{Name: "web2", Protocol: gwv1.HTTPProtocolType, Port: 8080, Hostname: ptr.To(gwv1.Hostname("b.example.org"))},
			gwv1.Listener{Name: "clash", Protocol: gwv1.TCPProtocolType, Port: 8080},
			gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000})},
		HTTPRoutes: []*gwv1.HTTPRoute{
			httpRoute("good", 0, []gwv1.Hostname{"a.example.com", "x.other.org"}, web, backendRef("s1", 80), backendRef("s2", 20)),
			httpRoute("missing", 1, nil, web, backendRef("nope", 1)),
			httpRoute("cross", 2, nil, web, cross),
			httpRoute("host", 3, []gwv1.Hostname{"a.example.org"}, web, backendRef("s1", 1)),
			httpRoute("ontcp", 4, nil, tcp, backendRef("s1", 1)),
			bad,
		},
		TCPRoutes: []*gwv1.TCPRoute{tcpRoute("tcponhttp", 0, web, backendRef("s1", 1))},
		Services:  []*corev1.Service{svc("s1", "198.18.0.1", nil), svc("s2", "198.18.0.2", nil)},
		Pool:      netip.MustParsePrefix("198.18.200.0/30"),
		HTTP:      true,
	}
	res := Translate(in)
	for _, c := range []struct{ route, typ, status, reason string }{
		{"HTTPRoute/demo/good", "Accepted", "True", "Accepted"},
		{"HTTPRoute/demo/good", "ResolvedRefs", "True", "ResolvedRefs"},
		{"HTTPRoute/demo/missing", "ResolvedRefs", "False", "BackendNotFound"},
		{"HTTPRoute/demo/cross", "ResolvedRefs", "False", "RefNotPermitted"},
		{"HTTPRoute/demo/host", "Accepted", "False", "NoMatchingListenerHostname"},
		{"HTTPRoute/demo/ontcp", "Accepted", "False", "NotAllowedByListeners"},
		{"HTTPRoute/demo/inject", "Accepted", "False", "UnsupportedValue"},
		{"TCPRoute/demo/tcponhttp", "Accepted", "False", "NotAllowedByListeners"},
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
	if len(res.Routes.Listeners) != 0 {
		t.Errorf("HTTP listeners must not reach the kernel: %+v", res.Routes.Listeners)
	}
	i := slices.IndexFunc(res.HTTP, func(h ingress.HTTPRoute) bool { return h.Route.Name == "good" })
	if i < 0 {
		t.Fatalf("good not handed to nginx: %+v", res.HTTP)
	}
	g := res.HTTP[i]
	if len(g.Attach) != 1 || g.Attach[0].Port != 8080 || !slices.Equal(g.Attach[0].Hostnames, []string{"a.example.com"}) {
		t.Errorf("attachments %+v", g.Attach)
	}
	if b := g.Backends[0]; len(b) != 2 || b[0].Addr.String() != "198.18.0.1:80" || b[0].Weight != 80 || b[1].Weight != 20 || b[0].Invalid {
		t.Errorf("backends %+v", b)
	}
	if m := slices.IndexFunc(res.HTTP, func(h ingress.HTTPRoute) bool { return h.Route.Name == "missing" }); m < 0 || !res.HTTP[m].Backends[0][0].Invalid {
		t.Errorf("missing: served with an invalid backend (500), got %+v", res.HTTP)
	}
	gs := res.Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	want := map[string]string{"web": "True", "web2": "True", "clash": "False", "tcp": "True"}
	for _, l := range gs.Listeners {
		if c := condOf(t, l.Conditions, "Accepted"); string(c.Status) != want[string(l.Name)] {
			t.Errorf("listener %s: Accepted %s %s", l.Name, c.Status, c.Reason)
		}
	}
	// good, missing, cross attach to web (invalid backends still attach).
	if gs.Listeners[0].AttachedRoutes != 3 {
		t.Errorf("web attachedRoutes %d, want 3", gs.Listeners[0].AttachedRoutes)
	}
	if k := gs.Listeners[0].SupportedKinds; len(k) != 1 || k[0].Kind != KindHTTPRoute {
		t.Errorf("supportedKinds %+v", k)
	}
}

func TestIntersectHostnames(t *testing.T) {
	h := func(s string) *gwv1.Hostname { return ptr.To(gwv1.Hostname(s)) }
	for _, c := range []struct {
		l     *gwv1.Hostname
		route []gwv1.Hostname
		want  []string
		ok    bool
	}{
		{nil, nil, nil, true},
		{h("a.com"), nil, []string{"a.com"}, true},
		{nil, []gwv1.Hostname{"x.a.com"}, []string{"x.a.com"}, true},
		{h("*.a.com"), []gwv1.Hostname{"x.a.com", "a.com", "y.b.com", "z.y.a.com"}, []string{"x.a.com", "z.y.a.com"}, true},
		{h("x.a.com"), []gwv1.Hostname{"*.a.com"}, []string{"x.a.com"}, true},
		{h("*.a.com"), []gwv1.Hostname{"*.x.a.com", "*.com"}, []string{"*.x.a.com", "*.a.com"}, true},
		{h("a.com"), []gwv1.Hostname{"b.com"}, nil, false},
	} {
		got, ok := intersectHostnames(c.l, c.route)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("%v %v: %v %v, want %v %v", c.l, c.route, got, ok, c.want, c.ok)
		}
	}
}

// TestHTTPSListeners: certificateRefs resolve to a Secret of the Gateway's
// namespace (another one needs a ReferenceGrant from Gateways); attached
// routes carry the Secret to the nginx layer.
func TestHTTPSListeners(t *testing.T) {
	certRef := func(ns, name string) *gwv1.ListenerTLSConfig {
		r := gwv1.SecretObjectReference{Name: gwv1.ObjectName(name)}
		if ns != "" {
			r.Namespace = ptr.To(gwv1.Namespace(ns))
		}
		return &gwv1.ListenerTLSConfig{CertificateRefs: []gwv1.SecretObjectReference{r}}
	}
	in := Input{
		Classes: []*gwv1.GatewayClass{class()},
		Gateways: []*gwv1.Gateway{gw("gw", 0,
			gwv1.Listener{Name: "good", Protocol: gwv1.HTTPSProtocolType, Port: 8443, TLS: certRef("", "cert")},
			gwv1.Listener{Name: "none", Protocol: gwv1.HTTPSProtocolType, Port: 8444},
			gwv1.Listener{Name: "cross", Protocol: gwv1.HTTPSProtocolType, Port: 8445, TLS: certRef("other", "cert")},
			gwv1.Listener{Name: "missing", Protocol: gwv1.HTTPSProtocolType, Port: 8446, TLS: certRef("", "nonexistent")},
			gwv1.Listener{Name: "malformed", Protocol: gwv1.HTTPSProtocolType, Port: 8447, TLS: certRef("", "malformed")})},
		HTTPRoutes: []*gwv1.HTTPRoute{httpRoute("r", 0, nil, gwv1.ParentReference{Name: "gw"}, backendRef("s1", 1))},
		Services:   []*corev1.Service{svc("s1", "198.18.0.1", nil)},
		Secrets: []*corev1.Secret{tlsSecret(t, ns, "cert"), tlsSecret(t, "other", "cert"),
			// conformance GatewayInvalidTLSConfiguration's malformed Secret
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "malformed"}, Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{corev1.TLSCertKey: []byte("Hello world\n"), corev1.TLSPrivateKeyKey: []byte("Hello world\n")}}},
		Pool: netip.MustParsePrefix("198.18.200.0/30"),
		HTTP: true,
	}
	res := Translate(in)
	gs := res.Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	for i, want := range []string{"ResolvedRefs", "InvalidCertificateRef", "RefNotPermitted", "InvalidCertificateRef", "InvalidCertificateRef"} {
		if c := condOf(t, gs.Listeners[i].Conditions, "ResolvedRefs"); c.Reason != want {
			t.Errorf("listener %s: ResolvedRefs %s (%s), want %s", gs.Listeners[i].Name, c.Reason, c.Message, want)
		}
	}
	// A certificateRef that cannot be used: the listener is not Programmed
	// (reason Invalid); routes still attach to it (attachedRoutes counts
	// them, conformance GatewayWithAttachedRoutes) but none is served.
	for _, i := range []int{3, 4} {
		c := condOf(t, gs.Listeners[i].Conditions, "Programmed")
		if c.Status != metav1.ConditionFalse || c.Reason != "Invalid" || gs.Listeners[i].AttachedRoutes != 1 {
			t.Errorf("listener %s: Programmed %s %s, attachedRoutes %d; want False Invalid, 1", gs.Listeners[i].Name, c.Status, c.Reason, gs.Listeners[i].AttachedRoutes)
		}
	}
	if len(res.HTTP) != 1 || len(res.HTTP[0].Attach) != 1 || res.HTTP[0].Attach[0].TLSSecret != ns+"/cert" || res.HTTP[0].Attach[0].Port != 8443 {
		t.Errorf("attachments %+v", res.HTTP)
	}
	// With a grant from Gateways in ns, the cross-namespace Secret resolves.
	in.Grants = []*gwv1.ReferenceGrant{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "g"},
		Spec: gwv1.ReferenceGrantSpec{
			From: []gwv1.ReferenceGrantFrom{{Group: gwv1.GroupName, Kind: "Gateway", Namespace: ns}},
			To:   []gwv1.ReferenceGrantTo{{Group: "", Kind: "Secret"}},
		},
	}}
	gs = Translate(in).Gateways[types.NamespacedName{Namespace: ns, Name: "gw"}]
	if c := condOf(t, gs.Listeners[2].Conditions, "ResolvedRefs"); c.Status != metav1.ConditionTrue {
		t.Errorf("cross with a grant: %+v", c)
	}
}

// TestHTTPHeadlessBackend: a headless Service as a backendRef (conformance
// HTTPRouteServiceTypes) is served by its ready endpoints at the slice
// port of the backendRef's Service port, weighted so the backendRef keeps
// its share: 1:1 with a VIP backend over 2 endpoints gives 1+1 : 2.
func TestHTTPHeadlessBackend(t *testing.T) {
	head := svc("head", "None", nil)
	head.Spec.Ports = []corev1.ServicePort{{Name: "first-port", Port: 8080, Protocol: corev1.ProtocolTCP}}
	ref := backendRef("head", 1)
	ref.Port = ptr.To(gwv1.PortNumber(8080))
	ready, notReady := true, false
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "head-1", Labels: map[string]string{discoveryv1.LabelServiceName: "head"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("first-port"), Port: ptr.To[int32](3000)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.19.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"198.19.1.2"}},
			{Addresses: []string{"198.19.1.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
		}}
	res := Translate(Input{
		Classes:    []*gwv1.GatewayClass{class()},
		Gateways:   []*gwv1.Gateway{gw("gw", 0, gwv1.Listener{Name: "http", Protocol: gwv1.HTTPProtocolType, Port: 80})},
		HTTPRoutes: []*gwv1.HTTPRoute{httpRoute("r", 0, nil, gwv1.ParentReference{Name: "gw"}, ref, backendRef("s1", 1))},
		Services:   []*corev1.Service{head, svc("s1", "198.18.0.1", nil)},
		Slices:     []*discoveryv1.EndpointSlice{sl},
		Pool:       netip.MustParsePrefix("198.18.200.0/30"),
		HTTP:       true,
	})
	if len(res.HTTP) != 1 {
		t.Fatalf("HTTP %+v", res.HTTP)
	}
	got := map[string]int32{}
	for _, b := range res.HTTP[0].Backends[0] {
		if b.Invalid {
			t.Errorf("invalid backend %+v", b)
		}
		got[b.Addr.String()] = b.Weight
	}
	want := map[string]int32{"198.19.1.1:3000": 1, "198.19.1.2:3000": 1, "198.18.0.1:80": 2}
	if len(got) != len(want) {
		t.Errorf("servers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("servers %v, want %v", got, want)
			break
		}
	}
}
