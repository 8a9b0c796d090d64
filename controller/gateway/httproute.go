package gateway

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller/ingress"
	"github.com/steelyard-net/steelyard/dataplane"
)

// KindHTTPRoute is the route kind of HTTP listeners, served by nginx.
const KindHTTPRoute = "HTTPRoute"

// translateHTTP attaches the HTTPRoutes (oldest first) to our HTTP
// listeners: route status as for L4 routes, plus the attachments the nginx
// layer renders. The nginx renderer's allow-list runs here too, so a route
// it would refuse is Accepted=False (UnsupportedValue) with the reason.
func translateHTTP(in Input, listeners map[types.NamespacedName][]*listener, svcs map[types.NamespacedName]*corev1.Service,
	nsLabels map[string]labels.Set, res *Result) {
	routes := slices.Clone(in.HTTPRoutes)
	sortByAge(routes, func(r *gwv1.HTTPRoute) *metav1.ObjectMeta { return &r.ObjectMeta })
	for _, hr := range routes {
		out := ingress.HTTPRoute{Route: hr}
		resolved := cond(string(gwv1.RouteConditionResolvedRefs), true, string(gwv1.RouteReasonResolvedRefs), "", hr.Generation)
		for _, rule := range hr.Spec.Rules {
			r := &route{kind: KindHTTPRoute, meta: &hr.ObjectMeta, proto: dataplane.TCP}
			for _, b := range rule.BackendRefs {
				r.backends = append(r.backends, b.BackendRef)
			}
			refs, c := resolveBackends(r, svcs, in.Grants)
			if c.Status != metav1.ConditionTrue && resolved.Status == metav1.ConditionTrue {
				resolved = withGen(c, hr.Generation)
			}
			out.Backends = append(out.Backends, httpBackends(refs, svcs, in.Slices))
		}
		invalid := ingress.ValidateHTTPRoute(hr)
		var parents []gwv1.RouteParentStatus
		for _, pr := range hr.Spec.ParentRefs {
			accepted := attachHTTP(hr, pr, invalid, listeners, nsLabels, &out)
			if accepted == nil {
				continue
			}
			parents = append(parents, gwv1.RouteParentStatus{ParentRef: pr, ControllerName: ControllerName,
				Conditions: []metav1.Condition{*accepted, resolved}})
		}
		if len(parents) > 0 {
			res.RouteParents[KindHTTPRoute+"/"+hr.Namespace+"/"+hr.Name] = parents
		}
		if len(out.Attach) > 0 {
			res.HTTP = append(res.HTTP, out)
		}
	}
}

// attachHTTP attaches an HTTPRoute to one parentRef; nil when the parent
// is not one of our Gateways.
func attachHTTP(hr *gwv1.HTTPRoute, pr gwv1.ParentReference, invalid error, listeners map[types.NamespacedName][]*listener,
	nsLabels map[string]labels.Set, out *ingress.HTTPRoute) *metav1.Condition {
	ns := hr.Namespace
	if pr.Namespace != nil {
		ns = string(*pr.Namespace)
	}
	if (pr.Group != nil && *pr.Group != gwv1.GroupName) || (pr.Kind != nil && *pr.Kind != kindGateway) {
		return nil
	}
	ls, ours := listeners[types.NamespacedName{Namespace: ns, Name: string(pr.Name)}]
	if !ours {
		return nil
	}
	accepted := func(ok bool, reason gwv1.RouteConditionReason, msg string) *metav1.Condition {
		c := cond(string(gwv1.RouteConditionAccepted), ok, string(reason), msg, hr.Generation)
		return &c
	}
	if invalid != nil {
		return accepted(false, gwv1.RouteReasonUnsupportedValue, "not served: "+invalid.Error())
	}
	matched, allowed, hosted := 0, 0, 0
	for _, l := range ls {
		if pr.SectionName != nil && *pr.SectionName != l.spec.Name {
			continue
		}
		if pr.Port != nil && *pr.Port != l.spec.Port {
			continue
		}
		matched++
		if !(l.valid || l.badCert) || !l.http || !kindAllowed(l, KindHTTPRoute) || !namespaceAllowed(l, hr.Namespace, nsLabels) {
			continue
		}
		allowed++
		hosts, ok := intersectHostnames(l.spec.Hostname, hr.Spec.Hostnames)
		if !ok {
			continue
		}
		hosted++
		l.attached++
		if !l.valid {
			continue // attached, not served: the listener has no certificate
		}
		out.Attach = append(out.Attach, ingress.HTTPAttachment{Port: int32(l.spec.Port), ListenPort: l.nginxPort, Hostnames: hosts, Listener: ns + "/" + string(pr.Name) + "/" + string(l.spec.Name),
			TLSSecret: l.tlsSecret, AnyHost: l.spec.Hostname == nil})
	}
	switch {
	case matched == 0:
		return accepted(false, gwv1.RouteReasonNoMatchingParent, "no listener matches the parentRef's sectionName and port")
	case allowed == 0:
		return accepted(false, gwv1.RouteReasonNotAllowedByListeners, fmt.Sprintf("no matching listener allows an HTTPRoute from namespace %s", hr.Namespace))
	case hosted == 0:
		return accepted(false, gwv1.RouteReasonNoMatchingListenerHostname, "no route hostname matches a listener hostname")
	}
	return accepted(true, gwv1.RouteReasonAccepted, "")
}

// intersectHostnames returns the hostnames a route serves on a listener
// (nil: any host) and false when none match. "*.x" matches any name
// ending in ".x" (one label or more), as the spec defines it.
func intersectHostnames(lh *gwv1.Hostname, route []gwv1.Hostname) ([]string, bool) {
	l := ""
	if lh != nil {
		l = string(*lh)
	}
	if len(route) == 0 {
		if l == "" {
			return nil, true
		}
		return []string{l}, true
	}
	var out []string
	add := func(h string) {
		if !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	for _, rh := range route {
		r := string(rh)
		switch {
		case l == "" || l == r:
			add(r)
		case wildcardCovers(l, r):
			add(r)
		case wildcardCovers(r, l):
			add(l)
		}
	}
	return out, len(out) > 0
}

// wildcardCovers reports whether wildcard w ("*.x") covers name n (exact
// or a longer wildcard).
func wildcardCovers(w, n string) bool {
	return strings.HasPrefix(w, "*.") && len(n) > len(w)-1 && strings.HasSuffix(n, w[1:])
}

// listenerSecret checks an HTTPS listener's TLS settings and returns its
// certificate Secret ("namespace/name"), or "" with the ResolvedRefs reason
// and message. The Secret's content is checked by the nginx renderer.
func listenerSecret(g *gwv1.Gateway, l gwv1.Listener, grants []*gwv1.ReferenceGrant, secrets map[types.NamespacedName]*corev1.Secret) (string, string, string) {
	if l.TLS == nil || len(l.TLS.CertificateRefs) == 0 {
		return "", string(gwv1.ListenerReasonInvalidCertificateRef), "an HTTPS listener needs tls.certificateRefs"
	}
	if l.TLS.Mode != nil && *l.TLS.Mode != gwv1.TLSModeTerminate {
		return "", string(gwv1.ListenerReasonInvalidCertificateRef), "only tls.mode Terminate is supported on HTTPS listeners"
	}
	ref := l.TLS.CertificateRefs[0]
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != nil && *ref.Kind != "Secret") {
		return "", string(gwv1.ListenerReasonInvalidCertificateRef), "certificateRefs[0]: only core Secrets are supported"
	}
	ns := g.Namespace
	if ref.Namespace != nil {
		ns = string(*ref.Namespace)
	}
	if ns != g.Namespace && !slices.ContainsFunc(grants, func(gr *gwv1.ReferenceGrant) bool {
		return gr.Namespace == ns &&
			slices.ContainsFunc(gr.Spec.From, func(f gwv1.ReferenceGrantFrom) bool {
				return f.Group == gwv1.GroupName && f.Kind == kindGateway && string(f.Namespace) == g.Namespace
			}) &&
			slices.ContainsFunc(gr.Spec.To, func(t gwv1.ReferenceGrantTo) bool {
				return t.Group == "" && t.Kind == "Secret" && (t.Name == nil || *t.Name == ref.Name)
			})
	}) {
		return "", string(gwv1.ListenerReasonRefNotPermitted), fmt.Sprintf("Secret %s/%s: no ReferenceGrant in %s allows it", ns, ref.Name, ns)
	}
	sec := secrets[types.NamespacedName{Namespace: ns, Name: string(ref.Name)}]
	if sec == nil {
		return "", string(gwv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("Secret %s/%s not found (or not of type %s)", ns, ref.Name, corev1.SecretTypeTLS)
	}
	if err := ingress.CheckTLSSecret(sec); err != nil {
		return "", string(gwv1.ListenerReasonInvalidCertificateRef), fmt.Sprintf("Secret %s/%s: %v", ns, ref.Name, err)
	}
	return ns + "/" + string(ref.Name), string(gwv1.ListenerReasonResolvedRefs), ""
}
