package gateway

import (
	"bufio"
	"bytes"
	"io"
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// fuzzNS is where every fuzzed object lives; goodNS holds a Gateway, a
// TCPRoute and a Service that no tenant object may disturb.
const (
	fuzzNS = "fuzz"
	goodNS = "good"
)

var fuzzPool = netip.MustParsePrefix("198.18.210.0/28")

// goodInput is the tenant that must not be disturbed: a Gateway at
// 198.18.211.1 whose listener takes routes of its own namespace only, its
// TCPRoute and the Service behind it, all older than anything fuzzed (so
// that an address or port conflict is the fuzzed object's loss).
func goodInput() Input {
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: goodNS, Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(t0)}
	}
	g := &gwv1.Gateway{ObjectMeta: meta("good-gw"), Spec: gwv1.GatewaySpec{
		GatewayClassName: "steelyard",
		Addresses:        []gwv1.GatewaySpecAddress{{Type: ptr.To(gwv1.IPAddressType), Value: "198.18.211.1"}},
		Listeners: []gwv1.Listener{{Name: "tcp", Port: 9000, Protocol: gwv1.TCPProtocolType,
			AllowedRoutes: &gwv1.AllowedRoutes{Namespaces: &gwv1.RouteNamespaces{From: ptr.To(gwv1.NamespacesFromSame)}}}},
	}}
	r := &gwv1.TCPRoute{ObjectMeta: meta("good-route"), Spec: gwv1.TCPRouteSpec{
		CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{{Name: "good-gw"}}},
		Rules:           []gwv1.TCPRouteRule{{BackendRefs: []gwv1.BackendRef{backendRef("good-svc", 1)}}},
	}}
	s := &corev1.Service{ObjectMeta: meta("good-svc"), Spec: corev1.ServiceSpec{ClusterIP: "198.18.211.10",
		Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	return Input{Classes: []*gwv1.GatewayClass{class()}, Gateways: []*gwv1.Gateway{g}, TCPRoutes: []*gwv1.TCPRoute{r},
		Services: []*corev1.Service{s}, Pool: fuzzPool, NodeAddrs: []netip.Addr{netip.MustParseAddr("198.19.0.1")}}
}

// decodeFuzzObjects adds the documents of data to in by their kind, each
// moved to fuzzNS and made younger than the good tenant. Documents that do
// not decode are dropped, as the informers would never deliver them.
func decodeFuzzObjects(data []byte, in *Input) {
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; i < 50; i++ {
		doc, err := r.Read()
		if err == io.EOF || err != nil {
			return
		}
		var tm metav1.TypeMeta
		if yaml.Unmarshal(doc, &tm) != nil {
			continue
		}
		at := metav1.NewTime(t0.Add(time.Hour + time.Duration(i)*time.Second))
		switch tm.Kind {
		case "Gateway":
			decodeTo(doc, at, func(o *gwv1.Gateway) *metav1.ObjectMeta { in.Gateways = append(in.Gateways, o); return &o.ObjectMeta })
		case "TCPRoute":
			decodeTo(doc, at, func(o *gwv1.TCPRoute) *metav1.ObjectMeta {
				in.TCPRoutes = append(in.TCPRoutes, o)
				return &o.ObjectMeta
			})
		case "UDPRoute":
			decodeTo(doc, at, func(o *gwv1.UDPRoute) *metav1.ObjectMeta {
				in.UDPRoutes = append(in.UDPRoutes, o)
				return &o.ObjectMeta
			})
		case "HTTPRoute":
			decodeTo(doc, at, func(o *gwv1.HTTPRoute) *metav1.ObjectMeta {
				in.HTTPRoutes = append(in.HTTPRoutes, o)
				return &o.ObjectMeta
			})
		case "ReferenceGrant":
			decodeTo(doc, at, func(o *gwv1b1.ReferenceGrant) *metav1.ObjectMeta {
				g := (*gwv1.ReferenceGrant)(o)
				in.Grants = append(in.Grants, g)
				return &g.ObjectMeta
			})
		case "Service":
			decodeTo(doc, at, func(o *corev1.Service) *metav1.ObjectMeta { in.Services = append(in.Services, o); return &o.ObjectMeta })
		case "Secret":
			decodeTo(doc, at, func(o *corev1.Secret) *metav1.ObjectMeta { in.Secrets = append(in.Secrets, o); return &o.ObjectMeta })
		}
	}
}

// decodeTo decodes doc into a new T and, if it decodes, hands it to add
// and moves it to fuzzNS with the creation time at.
func decodeTo[T any](doc []byte, at metav1.Time, add func(*T) *metav1.ObjectMeta) {
	o := new(T)
	if yaml.Unmarshal(doc, o) != nil {
		return
	}
	m := add(o)
	m.Namespace, m.CreationTimestamp = fuzzNS, at
}

// goodParts is what Translate gave the good tenant: its listener routes
// and its Gateway's status.
func goodParts(res Result) ([]any, any) {
	var ls []any
	for _, l := range res.Routes.Listeners {
		if l.Name.Namespace == goodNS {
			ls = append(ls, l)
		}
	}
	return ls, res.Gateways[types.NamespacedName{Namespace: goodNS, Name: "good-gw"}]
}

// FuzzTranslate feeds random Gateway API objects (multi-document YAML) to
// the translation beside a good tenant. It must not panic, it must be pure
// (the same snapshot gives the same Result on every node, which is what
// lets every agent program routes while one writes status), every
// listener address must come from a Gateway's spec.addresses or the pool,
// and nothing a tenant writes in its own namespace may change the good
// tenant's listener routes or its Gateway's status.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte(`apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: g}
spec:
  gatewayClassName: steelyard
  addresses: [{type: IPAddress, value: 198.18.211.1}]
  listeners: [{name: tcp, port: 9000, protocol: TCP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: steal}
spec:
  parentRefs: [{name: good-gw, namespace: good}]
  rules: [{backendRefs: [{name: good-svc, namespace: good, port: 80, weight: 5}]}]
`), true)
	f.Add([]byte(`kind: UDPRoute
apiVersion: gateway.networking.k8s.io/v1
metadata: {name: u}
spec:
  parentRefs: [{name: g, sectionName: udp, port: 53}]
  rules: [{backendRefs: [{name: dns, port: 53, weight: 0}, {name: x, kind: Pod, port: 1}]}]
---
kind: Gateway
apiVersion: gateway.networking.k8s.io/v1
metadata: {name: g}
spec:
  gatewayClassName: steelyard
  listeners: [{name: udp, port: 53, protocol: UDP}, {name: http, port: 80, protocol: HTTP}, {name: https, port: 443, protocol: HTTPS, tls: {certificateRefs: [{name: missing}]}}]
---
kind: Service
apiVersion: v1
metadata: {name: dns}
spec: {clusterIP: None, ports: [{port: 53, protocol: UDP}]}
`), false)
	f.Add([]byte(`kind: HTTPRoute
apiVersion: gateway.networking.k8s.io/v1
metadata: {name: h}
spec:
  parentRefs: [{name: g}]
  hostnames: ["*.example", "a;b"]
  rules: [{matches: [{path: {type: RegularExpression, value: "/x{"}}], backendRefs: [{name: web, port: 80, weight: 2147483647}, {name: web, port: 80, weight: 2147483647}]}]
---
kind: ReferenceGrant
apiVersion: gateway.networking.k8s.io/v1beta1
metadata: {name: r}
spec:
  from: [{group: gateway.networking.k8s.io, kind: TCPRoute, namespace: good}]
  to: [{group: "", kind: Service}]
`), true)
	f.Fuzz(func(t *testing.T, data []byte, http bool) {
		good := goodInput()
		good.HTTP = http
		baseLs, baseGw := goodParts(Translate(good))
		if len(baseLs) != 1 {
			t.Fatalf("the good tenant alone has %d listener routes, want 1", len(baseLs))
		}
		in := goodInput()
		in.HTTP = http
		decodeFuzzObjects(data, &in)
		res := Translate(in)
		if again := Translate(in); !reflect.DeepEqual(res, again) {
			t.Fatalf("Translate is not pure: two runs on one snapshot differ")
		}
		ls, gw := goodParts(res)
		if !reflect.DeepEqual(ls, baseLs) || !reflect.DeepEqual(gw, baseGw) {
			t.Fatalf("objects in namespace %s changed the good tenant:\nroutes %+v\nwant   %+v\nstatus %+v\nwant   %+v", fuzzNS, ls, baseLs, gw, baseGw)
		}
		allowed := map[netip.Addr]bool{}
		for _, g := range in.Gateways {
			for _, a := range g.Spec.Addresses {
				if ip, err := netip.ParseAddr(a.Value); err == nil {
					allowed[ip] = true
				}
			}
		}
		for _, l := range res.Routes.Listeners {
			ip := l.VIP.IP
			if !allowed[ip] && !fuzzPool.Contains(ip) {
				t.Fatalf("listener %s at %s: neither a Gateway's spec.addresses nor the pool %s", l.Name, ip, fuzzPool)
			}
		}
	})
}
