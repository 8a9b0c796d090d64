package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/controller/ingress"
	"github.com/steelyard-net/steelyard/dataplane"
)

// ControllerName is the GatewayClass controllerName steelyard serves.
const ControllerName gwv1.GatewayController = "steelyard.io/gateway-controller"

// The route kinds and groups this package knows.
const (
	KindTCPRoute = "TCPRoute"
	KindUDPRoute = "UDPRoute"
	kindGateway  = "Gateway"
	kindService  = "Service"
)

// Input is one snapshot of everything the translation reads.
type Input struct {
	Classes   []*gwv1.GatewayClass
	Gateways  []*gwv1.Gateway
	TCPRoutes []*gwv1.TCPRoute
	UDPRoutes []*gwv1.UDPRoute
	// HTTPRoutes attach to HTTP listeners and are served by nginx.
	HTTPRoutes []*gwv1.HTTPRoute
	Grants     []*gwv1.ReferenceGrant
	Services   []*corev1.Service
	// Namespaces are the cluster's Namespaces, for listeners that allow
	// routes from namespaces selected by label.
	Namespaces []*corev1.Namespace
	// HTTP is true when the nginx layer serves HTTP listeners (steelyard
	// run --gateway --ingress); without it they are UnsupportedProtocol.
	HTTP bool
	// Pool is the --gateway-address-pool: Gateways without spec.addresses
	// get one address from it. Invalid (zero) for none.
	Pool netip.Prefix
	// Secrets are the kubernetes.io/tls Secrets HTTPS listeners may name
	// (read only with HTTP).
	Secrets []*corev1.Secret
	// Slices are the EndpointSlices of headless Services that HTTPRoutes
	// name (read only with HTTP): nginx proxies to their endpoints.
	Slices []*discoveryv1.EndpointSlice
	// NodeAddrs are this node's addresses: an HTTP listener's Gateway
	// address and port are forwarded to nginx on the one of its family.
	NodeAddrs []netip.Addr
	// HTTPPortBase is the first port nginx serves HTTP listeners on (one
	// per Gateway and listener port); 0 means DefaultHTTPPortBase.
	HTTPPortBase int32
}

// Result is what one snapshot means: the splits for the Builder and the
// status every object of ours should carry.
type Result struct {
	Routes controller.Routes
	// Classes holds the conditions of our GatewayClasses, by name.
	Classes map[string][]metav1.Condition
	// Gateways holds the status of our Gateways.
	Gateways map[types.NamespacedName]gwv1.GatewayStatus
	// RouteParents holds, per route ("Kind/namespace/name"), the parent
	// statuses we own (controllerName ours); others' entries are kept by
	// the writer.
	RouteParents map[string][]gwv1.RouteParentStatus
	// HTTP holds the HTTPRoutes attached to our HTTP listeners, for the
	// nginx layer (ingress.Input.HTTPRoutes).
	HTTP []ingress.HTTPRoute
}

// route is a TCPRoute or UDPRoute, seen the same way.
type route struct {
	kind     string
	meta     *metav1.ObjectMeta
	parents  []gwv1.ParentReference
	backends []gwv1.BackendRef
	proto    dataplane.Protocol
}

func (r *route) key() string { return r.kind + "/" + r.meta.Namespace + "/" + r.meta.Name }

// listener is one listener of one of our Gateways, with its verdict.
type listener struct {
	gw    *gwv1.Gateway
	spec  gwv1.Listener
	proto dataplane.Protocol
	// valid is false when the listener cannot carry routes.
	valid bool
	// http marks an HTTP listener: its routes are HTTPRoutes, served by
	// nginx, never by kernel rules.
	http bool
	// tlsSecret is "namespace/name" of an HTTPS listener's certificate.
	tlsSecret string
	// nginxPort is the port nginx serves a valid HTTP listener on.
	nginxPort int32
	// badCert marks an HTTPS listener that is invalid only for its
	// certificateRefs: routes still attach (attachedRoutes counts them,
	// as conformance GatewayWithAttachedRoutes wants), none is served.
	badCert  bool
	kinds    []gwv1.RouteGroupKind
	attached int32
	// route is the route that holds the listener (the oldest attached).
	route string
	cond  []metav1.Condition
}

// Translate turns a snapshot into splits and status. It is pure: every
// agent computes the same Result from the same snapshot, which is what
// lets each node program routes while only the leader writes status.
func Translate(in Input) Result {
	res := Result{
		Classes:      map[string][]metav1.Condition{},
		Gateways:     map[types.NamespacedName]gwv1.GatewayStatus{},
		RouteParents: map[string][]gwv1.RouteParentStatus{},
	}
	ours := map[string]bool{}
	for _, c := range in.Classes {
		if c.Spec.ControllerName != ControllerName {
			continue
		}
		ours[c.Name] = true
		res.Classes[c.Name] = []metav1.Condition{cond(string(gwv1.GatewayClassConditionStatusAccepted), true,
			string(gwv1.GatewayClassReasonAccepted), "handled by steelyard", c.Generation)}
	}
	svcs := map[types.NamespacedName]*corev1.Service{}
	for _, s := range in.Services {
		svcs[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	nsLabels := map[string]labels.Set{}
	for _, n := range in.Namespaces {
		nsLabels[n.Name] = n.Labels
	}

	gws := slices.Clone(in.Gateways)
	gws = slices.DeleteFunc(gws, func(g *gwv1.Gateway) bool { return !ours[string(g.Spec.GatewayClassName)] })
	sortByAge(gws, func(g *gwv1.Gateway) *metav1.ObjectMeta { return &g.ObjectMeta })
	addrs := assignAddresses(gws, in.Pool)

	secrets := map[types.NamespacedName]*corev1.Secret{}
	for _, s := range in.Secrets {
		secrets[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	listeners := map[types.NamespacedName][]*listener{}
	for _, g := range gws {
		listeners[nn(&g.ObjectMeta)] = gatewayListeners(g, in.HTTP, in.Grants, secrets)
	}
	nginxPorts(gws, listeners, in.HTTPPortBase)

	var routes []*route
	for _, r := range in.TCPRoutes {
		routes = append(routes, &route{kind: KindTCPRoute, meta: &r.ObjectMeta, parents: r.Spec.ParentRefs, backends: firstRule(r.Spec.Rules, func(x gwv1.TCPRouteRule) []gwv1.BackendRef { return x.BackendRefs }), proto: dataplane.TCP})
	}
	for _, r := range in.UDPRoutes {
		routes = append(routes, &route{kind: KindUDPRoute, meta: &r.ObjectMeta, parents: r.Spec.ParentRefs, backends: firstRule(r.Spec.Rules, func(x gwv1.UDPRouteRule) []gwv1.BackendRef { return x.BackendRefs }), proto: dataplane.UDP})
	}
	sortByAge(routes, func(r *route) *metav1.ObjectMeta { return r.meta })

	servicesTaken := map[string]string{} // "ns/svc:proto:port" -> route
	for _, r := range routes {
		refs, resolved := resolveBackends(r, svcs, in.Grants)
		var parents []gwv1.RouteParentStatus
		for _, pr := range r.parents {
			accepted := attach(r, pr, refs, listeners, addrs, svcs, nsLabels, servicesTaken, &res.Routes)
			if accepted == nil {
				continue // not a parent of ours
			}
			parents = append(parents, gwv1.RouteParentStatus{
				ParentRef:      pr,
				ControllerName: ControllerName,
				Conditions:     []metav1.Condition{*accepted, withGen(resolved, r.meta.Generation)},
			})
		}
		if len(parents) > 0 {
			res.RouteParents[r.key()] = parents
		}
	}

	translateHTTP(in, listeners, svcs, nsLabels, &res)
	res.Routes.Listeners = append(res.Routes.Listeners, httpForwards(gws, listeners, addrs, in.NodeAddrs)...)

	for _, g := range gws {
		res.Gateways[nn(&g.ObjectMeta)] = gatewayStatus(g, addrs[nn(&g.ObjectMeta)], listeners[nn(&g.ObjectMeta)])
	}
	return res
}

func nn(m *metav1.ObjectMeta) types.NamespacedName {
	return types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
}

// sortByAge orders objects the way the Gateway API breaks ties: oldest
// first, then by namespace/name.
func sortByAge[T any](xs []T, meta func(T) *metav1.ObjectMeta) {
	sort.SliceStable(xs, func(i, j int) bool {
		a, b := meta(xs[i]), meta(xs[j])
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
}

// firstRule returns the backendRefs of a route's first rule. TCP and UDP
// routes have no matches, so only one rule can ever be used.
func firstRule[R any](rules []R, refs func(R) []gwv1.BackendRef) []gwv1.BackendRef {
	if len(rules) == 0 {
		return nil
	}
	return refs(rules[0])
}

func cond(typ string, ok bool, reason, msg string, gen int64) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
}

func withGen(c metav1.Condition, gen int64) metav1.Condition {
	c.ObservedGeneration = gen
	return c
}

// defaultKinds are the route kinds a listener of each protocol accepts.
var defaultKinds = map[gwv1.ProtocolType]string{
	gwv1.TCPProtocolType:  KindTCPRoute,
	gwv1.UDPProtocolType:  KindUDPRoute,
	gwv1.HTTPProtocolType: KindHTTPRoute,
}

// gatewayListeners checks each listener of g: protocol, kinds, conflicts.
func gatewayListeners(g *gwv1.Gateway, http bool, grants []*gwv1.ReferenceGrant, secrets map[types.NamespacedName]*corev1.Secret) []*listener {
	var out []*listener
	seen := map[string]bool{}
	httpPorts := map[string]bool{} // ports held by HTTP listeners
	gen := g.Generation
	group := gwv1.Group(gwv1.GroupName)
	for _, l := range g.Spec.Listeners {
		li := &listener{gw: g, spec: l}
		out = append(out, li)
		kind, supported := defaultKinds[l.Protocol]
		msg := fmt.Sprintf("protocol %s is not supported by steelyard's L4 layer", l.Protocol)
		if l.Protocol == gwv1.HTTPSProtocolType && http {
			kind, supported = KindHTTPRoute, true
		}
		if (l.Protocol == gwv1.HTTPProtocolType || l.Protocol == gwv1.HTTPSProtocolType) && !http {
			supported, msg = false, "HTTP and HTTPS listeners are served by steelyard's nginx layer: run the agents with --gateway and --ingress"
		}
		if !supported {
			li.cond = []metav1.Condition{
				cond(string(gwv1.ListenerConditionAccepted), false, string(gwv1.ListenerReasonUnsupportedProtocol), msg, gen),
				cond(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonInvalid), "listener not accepted", gen),
				cond(string(gwv1.ListenerConditionResolvedRefs), true, string(gwv1.ListenerReasonResolvedRefs), "", gen),
				cond(string(gwv1.ListenerConditionConflicted), false, string(gwv1.ListenerReasonNoConflicts), "", gen),
			}
			li.kinds = []gwv1.RouteGroupKind{}
			continue
		}
		li.proto = dataplane.TCP
		if l.Protocol == gwv1.UDPProtocolType {
			li.proto = dataplane.UDP
		}
		li.http = l.Protocol == gwv1.HTTPProtocolType || l.Protocol == gwv1.HTTPSProtocolType
		refsOK, refsReason, refsMsg := true, string(gwv1.ListenerReasonResolvedRefs), ""
		if l.AllowedRoutes != nil && len(l.AllowedRoutes.Kinds) > 0 {
			for _, k := range l.AllowedRoutes.Kinds {
				if (k.Group == nil || *k.Group == group) && string(k.Kind) == kind {
					li.kinds = append(li.kinds, gwv1.RouteGroupKind{Group: &group, Kind: k.Kind})
				} else {
					refsOK, refsReason, refsMsg = false, string(gwv1.ListenerReasonInvalidRouteKinds), fmt.Sprintf("kind %s is not supported on a %s listener", k.Kind, l.Protocol)
				}
			}
		} else {
			li.kinds = []gwv1.RouteGroupKind{{Group: &group, Kind: gwv1.Kind(kind)}}
		}
		if li.kinds == nil {
			li.kinds = []gwv1.RouteGroupKind{}
		}
		tlsOK := true
		if l.Protocol == gwv1.HTTPSProtocolType {
			li.tlsSecret, refsReason, refsMsg = listenerSecret(g, l, grants, secrets)
			if li.tlsSecret == "" {
				refsOK, tlsOK = false, false
			}
		}
		// Two listeners of one Gateway on the same port and protocol
		// cannot both be served: no hostname tells L4 traffic apart.
		k := fmt.Sprintf("%d/%s", l.Port, li.proto)
		conflicted := seen[k] && !(li.http && httpPorts[k])
		if li.http {
			// HTTP listeners on one port differ by hostname (nginx's
			// server_name); the same hostname twice conflicts.
			h := ""
			if l.Hostname != nil {
				h = string(*l.Hostname)
			}
			conflicted = conflicted || seen[k+"/"+h]
			seen[k+"/"+h] = true
			if !seen[k] {
				httpPorts[k] = true
			}
		} else {
			conflicted = conflicted || httpPorts[k]
		}
		seen[k] = true
		li.valid = !conflicted && len(li.kinds) > 0 && tlsOK
		li.badCert = !conflicted && len(li.kinds) > 0 && !tlsOK
		conflict := cond(string(gwv1.ListenerConditionConflicted), false, string(gwv1.ListenerReasonNoConflicts), "", gen)
		accepted := cond(string(gwv1.ListenerConditionAccepted), true, string(gwv1.ListenerReasonAccepted), "", gen)
		programmed := cond(string(gwv1.ListenerConditionProgrammed), true, string(gwv1.ListenerReasonProgrammed), "", gen)
		if conflicted {
			conflict = cond(string(gwv1.ListenerConditionConflicted), true, string(gwv1.ListenerReasonProtocolConflict), "another listener uses port "+k, gen)
			accepted = cond(string(gwv1.ListenerConditionAccepted), false, string(gwv1.ListenerReasonPortUnavailable), "another listener uses port "+k, gen)
		}
		if !li.valid {
			programmed = cond(string(gwv1.ListenerConditionProgrammed), false, string(gwv1.ListenerReasonInvalid), "listener cannot carry routes", gen)
		}
		li.cond = []metav1.Condition{accepted, programmed, cond(string(gwv1.ListenerConditionResolvedRefs), refsOK, refsReason, refsMsg, gen), conflict}
	}
	return out
}

// resolveBackends checks a route's backendRefs and returns them with the
// ResolvedRefs condition (the reason of the first bad one).
func resolveBackends(r *route, svcs map[types.NamespacedName]*corev1.Service, grants []*gwv1.ReferenceGrant) ([]controller.RouteBackend, metav1.Condition) {
	ok := cond(string(gwv1.RouteConditionResolvedRefs), true, string(gwv1.RouteReasonResolvedRefs), "", 0)
	first := ok
	var out []controller.RouteBackend
	for _, br := range r.backends {
		rb := controller.RouteBackend{Namespace: r.meta.Namespace, Service: string(br.Name), Weight: 1}
		if br.Weight != nil {
			rb.Weight = uint32(max(*br.Weight, 0))
		}
		if br.Namespace != nil {
			rb.Namespace = string(*br.Namespace)
		}
		if br.Port != nil {
			rb.Port = int32(*br.Port)
		}
		reason, msg := "", ""
		switch {
		case (br.Group != nil && *br.Group != "") || (br.Kind != nil && *br.Kind != kindService):
			reason, msg = string(gwv1.RouteReasonInvalidKind), fmt.Sprintf("backendRef %s: only core Services are supported", br.Name)
		case rb.Namespace != r.meta.Namespace && !granted(grants, r.kind, r.meta.Namespace, rb.Namespace, rb.Service):
			reason, msg = string(gwv1.RouteReasonRefNotPermitted), fmt.Sprintf("backendRef %s/%s: no ReferenceGrant in %s allows it", rb.Namespace, rb.Service, rb.Namespace)
		case svcs[types.NamespacedName{Namespace: rb.Namespace, Name: rb.Service}] == nil:
			reason, msg = string(gwv1.RouteReasonBackendNotFound), fmt.Sprintf("backendRef %s/%s: Service not found", rb.Namespace, rb.Service)
		case br.Port == nil || !hasPort(svcs[types.NamespacedName{Namespace: rb.Namespace, Name: rb.Service}], rb.Port, r.proto):
			reason, msg = string(gwv1.RouteReasonBackendNotFound), fmt.Sprintf("backendRef %s/%s: no %s port %d", rb.Namespace, rb.Service, r.proto, rb.Port)
		}
		if reason != "" {
			rb.Invalid = true
			if first.Status == metav1.ConditionTrue {
				first = cond(string(gwv1.RouteConditionResolvedRefs), false, reason, msg, 0)
			}
		}
		out = append(out, rb)
	}
	return out, first
}

func hasPort(svc *corev1.Service, port int32, proto dataplane.Protocol) bool {
	for _, p := range svc.Spec.Ports {
		pp := dataplane.TCP
		if p.Protocol == corev1.ProtocolUDP {
			pp = dataplane.UDP
		} else if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			continue
		}
		if p.Port == port && pp == proto {
			return true
		}
	}
	return false
}

// granted reports whether a ReferenceGrant in toNS lets routes of kind in
// fromNS refer to Service name.
func granted(grants []*gwv1.ReferenceGrant, kind, fromNS, toNS, name string) bool {
	for _, g := range grants {
		if g.Namespace != toNS {
			continue
		}
		from := slices.ContainsFunc(g.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
			return f.Group == gwv1.GroupName && string(f.Kind) == kind && string(f.Namespace) == fromNS
		})
		to := slices.ContainsFunc(g.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
			return t.Group == "" && t.Kind == kindService && (t.Name == nil || string(*t.Name) == name)
		})
		if from && to {
			return true
		}
	}
	return false
}

// attach attaches route r to one parentRef and returns its Accepted
// condition, or nil when the parent is not ours.
func attach(r *route, pr gwv1.ParentReference, refs []controller.RouteBackend, listeners map[types.NamespacedName][]*listener,
	addrs map[types.NamespacedName][]netip.Addr, svcs map[types.NamespacedName]*corev1.Service, nsLabels map[string]labels.Set,
	taken map[string]string, out *controller.Routes) *metav1.Condition {
	gen := r.meta.Generation
	ns := r.meta.Namespace
	if pr.Namespace != nil {
		ns = string(*pr.Namespace)
	}
	group, kind := gwv1.GroupName, kindGateway
	if pr.Group != nil {
		group = string(*pr.Group)
	}
	if pr.Kind != nil {
		kind = string(*pr.Kind)
	}
	accepted := func(ok bool, reason gwv1.RouteConditionReason, msg string) *metav1.Condition {
		c := cond(string(gwv1.RouteConditionAccepted), ok, string(reason), msg, gen)
		return &c
	}
	if group == "" && kind == kindService {
		return attachService(r, pr, ns, refs, svcs, taken, out, accepted)
	}
	if group != gwv1.GroupName || kind != kindGateway {
		return nil
	}
	ls, ours := listeners[types.NamespacedName{Namespace: ns, Name: string(pr.Name)}]
	if !ours {
		return nil
	}
	matched, allowed := 0, 0
	for _, l := range ls {
		if pr.SectionName != nil && *pr.SectionName != l.spec.Name {
			continue
		}
		if pr.Port != nil && *pr.Port != l.spec.Port {
			continue
		}
		matched++
		if !l.valid || l.http || l.proto != r.proto || !kindAllowed(l, r.kind) || !namespaceAllowed(l, r.meta.Namespace, nsLabels) {
			continue
		}
		allowed++
		l.attached++
		if l.route != "" {
			continue // the listener serves an older route; see docs/gateway.md
		}
		l.route = r.key()
		for _, a := range addrs[types.NamespacedName{Namespace: ns, Name: string(pr.Name)}] {
			out.Listeners = append(out.Listeners, controller.ListenerRoute{
				Name:     dataplane.ServicePortName{Namespace: ns, Name: string(pr.Name), Port: string(l.spec.Name) + "/" + r.key()},
				VIP:      dataplane.VIP{IP: a, Port: uint16(l.spec.Port), Protocol: r.proto},
				Backends: refs,
			})
		}
	}
	switch {
	case matched == 0:
		return accepted(false, gwv1.RouteReasonNoMatchingParent, "no listener matches the parentRef's sectionName and port")
	case allowed == 0:
		return accepted(false, gwv1.RouteReasonNotAllowedByListeners, fmt.Sprintf("no matching listener allows a %s from namespace %s", r.kind, r.meta.Namespace))
	}
	return accepted(true, gwv1.RouteReasonAccepted, "")
}

// attachService attaches a route to a Service parent (GAMMA): the Service's
// VIP splits by the route's backends. The oldest route wins a port.
func attachService(r *route, pr gwv1.ParentReference, ns string, refs []controller.RouteBackend, svcs map[types.NamespacedName]*corev1.Service,
	taken map[string]string, out *controller.Routes, accepted func(bool, gwv1.RouteConditionReason, string) *metav1.Condition) *metav1.Condition {
	if ns != r.meta.Namespace {
		// Consumer routes (another namespace's view of a Service) need
		// per-client-namespace rules, which the dataplanes do not have.
		return accepted(false, gwv1.RouteReasonUnsupportedValue, "a route can have only a Service of its own namespace as parent")
	}
	svc := svcs[types.NamespacedName{Namespace: ns, Name: string(pr.Name)}]
	if svc == nil {
		return accepted(false, gwv1.RouteReasonNoMatchingParent, "parent Service "+ns+"/"+string(pr.Name)+" not found")
	}
	port := int32(0)
	if pr.Port != nil {
		port = int32(*pr.Port)
		if !hasPort(svc, port, r.proto) {
			return accepted(false, gwv1.RouteReasonNoMatchingParent, fmt.Sprintf("parent Service has no %s port %d", r.proto, port))
		}
	}
	k := fmt.Sprintf("%s/%s:%s:%d", ns, pr.Name, r.proto, port)
	if other, ok := taken[k]; ok && other != r.key() {
		return accepted(false, gwv1.RouteReasonNotAllowedByListeners, "the Service port is already split by the older "+other)
	}
	taken[k] = r.key()
	out.Services = append(out.Services, controller.ServiceRoute{
		Service: types.NamespacedName{Namespace: ns, Name: string(pr.Name)}, Port: port, Protocol: r.proto,
		Route: r.key(), Backends: refs,
	})
	return accepted(true, gwv1.RouteReasonAccepted, "")
}

func kindAllowed(l *listener, kind string) bool {
	return slices.ContainsFunc(l.kinds, func(k gwv1.RouteGroupKind) bool { return string(k.Kind) == kind })
}

func namespaceAllowed(l *listener, ns string, nsLabels map[string]labels.Set) bool {
	from := gwv1.NamespacesFromSame
	var sel *metav1.LabelSelector
	if ar := l.spec.AllowedRoutes; ar != nil && ar.Namespaces != nil {
		if ar.Namespaces.From != nil {
			from = *ar.Namespaces.From
		}
		sel = ar.Namespaces.Selector
	}
	switch from {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSame:
		return ns == l.gw.Namespace
	case gwv1.NamespacesFromSelector:
		if sel == nil {
			return false
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return false
		}
		set, ok := nsLabels[ns]
		return ok && s.Matches(set)
	}
	return false
}

// gatewayStatus is the status of one of our Gateways.
func gatewayStatus(g *gwv1.Gateway, addrs []netip.Addr, ls []*listener) gwv1.GatewayStatus {
	gen := g.Generation
	st := gwv1.GatewayStatus{Addresses: []gwv1.GatewayStatusAddress{}, Listeners: []gwv1.ListenerStatus{}}
	ipType := gwv1.IPAddressType
	for _, a := range addrs {
		st.Addresses = append(st.Addresses, gwv1.GatewayStatusAddress{Type: &ipType, Value: a.String()})
	}
	accepted := cond(string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonAccepted), "", gen)
	if bad := unsupportedAddress(g); bad != "" {
		accepted = cond(string(gwv1.GatewayConditionAccepted), false, string(gwv1.GatewayReasonUnsupportedAddress), bad, gen)
	} else if !slices.ContainsFunc(ls, func(l *listener) bool { return l.valid }) {
		accepted = cond(string(gwv1.GatewayConditionAccepted), false, string(gwv1.GatewayReasonListenersNotValid), "no listener can carry routes", gen)
	} else if slices.ContainsFunc(ls, func(l *listener) bool { return !l.valid }) {
		// Accepted, and the reason says some listeners are not (the
		// spec's ListenersNotValid; conformance GatewayListenerUnsupportedProtocol).
		accepted = cond(string(gwv1.GatewayConditionAccepted), true, string(gwv1.GatewayReasonListenersNotValid), "some listeners are not valid: see their conditions", gen)
	}
	programmed := cond(string(gwv1.GatewayConditionProgrammed), true, string(gwv1.GatewayReasonProgrammed), "listeners are programmed on every node like external IPs", gen)
	if len(addrs) == 0 {
		programmed = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonAddressNotAssigned), "no address: set spec.addresses or give steelyard --gateway-address-pool (or the pool is exhausted)", gen)
	} else if accepted.Status != metav1.ConditionTrue {
		programmed = cond(string(gwv1.GatewayConditionProgrammed), false, string(gwv1.GatewayReasonInvalid), "Gateway not accepted", gen)
	}
	st.Conditions = []metav1.Condition{accepted, programmed}
	for _, l := range ls {
		c := l.cond
		if len(addrs) == 0 && l.valid {
			c = slices.Clone(c)
			for i := range c {
				if c[i].Type == string(gwv1.ListenerConditionProgrammed) {
					c[i] = cond(c[i].Type, false, string(gwv1.ListenerReasonPending), "the Gateway has no address", gen)
				}
			}
		}
		st.Listeners = append(st.Listeners, gwv1.ListenerStatus{Name: l.spec.Name, SupportedKinds: l.kinds, AttachedRoutes: l.attached, Conditions: c})
	}
	return st
}

// unsupportedAddress explains why a Gateway's spec.addresses cannot be
// used, or returns "".
func unsupportedAddress(g *gwv1.Gateway) string {
	for _, a := range g.Spec.Addresses {
		if a.Type != nil && *a.Type != gwv1.IPAddressType {
			return fmt.Sprintf("address type %s is not supported, only IPAddress", *a.Type)
		}
		if a.Value == "" {
			return "an empty IPAddress value asks for any address, which steelyard does not choose; leave spec.addresses out to use the pool"
		}
		if _, err := netip.ParseAddr(a.Value); err != nil {
			return fmt.Sprintf("address %q is not an IP address", a.Value)
		}
	}
	return ""
}

// assignAddresses gives each Gateway (oldest first) its addresses: its
// spec.addresses, else the address it holds in status when that is in the
// pool and free, else the first free address of the pool. All nodes see
// the same Gateways and statuses, so they agree.
func assignAddresses(gws []*gwv1.Gateway, pool netip.Prefix) map[types.NamespacedName][]netip.Addr {
	out := map[types.NamespacedName][]netip.Addr{}
	used := map[netip.Addr]bool{}
	var fromPool []*gwv1.Gateway
	for _, g := range gws {
		if unsupportedAddress(g) != "" {
			continue
		}
		if len(g.Spec.Addresses) == 0 {
			fromPool = append(fromPool, g)
			continue
		}
		for _, a := range g.Spec.Addresses {
			ip := netip.MustParseAddr(a.Value)
			if !slices.Contains(out[nn(&g.ObjectMeta)], ip) {
				out[nn(&g.ObjectMeta)] = append(out[nn(&g.ObjectMeta)], ip)
			}
			used[ip] = true
		}
	}
	if !pool.IsValid() {
		return out
	}
	var pending []*gwv1.Gateway
	for _, g := range fromPool {
		kept := false
		for _, a := range g.Status.Addresses {
			ip, err := netip.ParseAddr(a.Value)
			if err == nil && pool.Contains(ip) && !used[ip] && usable(pool, ip) {
				out[nn(&g.ObjectMeta)], used[ip], kept = []netip.Addr{ip}, true, true
				break
			}
		}
		if !kept {
			pending = append(pending, g)
		}
	}
	ip := pool.Masked().Addr()
	for _, g := range pending {
		for ; pool.Contains(ip) && (used[ip] || !usable(pool, ip)); ip = ip.Next() {
		}
		if !pool.Contains(ip) {
			break // exhausted: the rest stay without an address
		}
		out[nn(&g.ObjectMeta)], used[ip] = []netip.Addr{ip}, true
	}
	return out
}

// usable is false for the network and broadcast addresses of an IPv4 pool
// larger than a /31.
func usable(pool netip.Prefix, ip netip.Addr) bool {
	if !ip.Is4() || pool.Bits() >= 31 {
		return true
	}
	if ip == pool.Masked().Addr() {
		return false
	}
	b := ip.As4()
	host := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	mask := uint32(1)<<(32-pool.Bits()) - 1
	return host&mask != mask
}

// RouteKey parses "Kind/namespace/name".
func RouteKey(s string) (kind string, name types.NamespacedName, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return "", types.NamespacedName{}, false
	}
	return parts[0], types.NamespacedName{Namespace: parts[1], Name: parts[2]}, true
}
