package gateway

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/controller/ingress"
)

// maxHeadlessEndpoints bounds the nginx servers of one headless backendRef
// (the rest get no requests), so the weights below stay small integers.
const maxHeadlessEndpoints = 64

// headlessBackends returns the nginx servers of a backendRef to a headless
// Service (no VIP to proxy to, conformance HTTPRouteServiceTypes): its ready
// endpoints at the backendRef port, from the Service's EndpointSlices, each
// weighted weight*scale/n so the backendRef keeps its share (the caller
// multiplies the rule's other weights by scale). Unlike VIP upstreams, a
// change of these endpoints changes nginx.conf: one reload.
func headlessBackends(rb controller.RouteBackend, svc *corev1.Service, slices []*discoveryv1.EndpointSlice) []netip.AddrPort {
	portName := ""
	for _, p := range svc.Spec.Ports {
		if p.Port == rb.Port {
			portName = p.Name
		}
	}
	var out []netip.AddrPort
	seen := map[netip.AddrPort]bool{}
	for _, sl := range slices {
		if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name || sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		var port int32
		for _, p := range sl.Ports {
			if p.Port != nil && (p.Name == nil && portName == "" || p.Name != nil && *p.Name == portName) {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ap := netip.AddrPortFrom(ip, uint16(port))
				if !seen[ap] && len(out) < maxHeadlessEndpoints {
					seen[ap] = true
					out = append(out, ap)
				}
			}
		}
	}
	return out
}

// httpBackends turns resolved backendRefs into nginx servers: Service VIPs,
// or the endpoints of headless Services. Weights are scaled by the product
// of the headless endpoint counts' least common multiple, so each
// backendRef keeps weight / sum of weights.
func httpBackends(refs []controller.RouteBackend, svcs map[types.NamespacedName]*corev1.Service, slices []*discoveryv1.EndpointSlice) []ingress.HTTPBackend {
	type part struct {
		b     ingress.HTTPBackend
		addrs []netip.AddrPort // headless endpoints
	}
	parts := make([]part, 0, len(refs))
	scale := int64(1)
	for _, rb := range refs {
		p := part{b: ingress.HTTPBackend{Weight: int32(min(rb.Weight, 1<<20)), Invalid: rb.Invalid}}
		if !p.b.Invalid {
			svc := svcs[types.NamespacedName{Namespace: rb.Namespace, Name: rb.Service}]
			ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
			switch {
			case err == nil && !ip.IsUnspecified():
				p.b.Addr = netip.AddrPortFrom(ip, uint16(rb.Port))
			case svc.Spec.ClusterIP == corev1.ClusterIPNone:
				p.addrs = headlessBackends(rb, svc, slices)
				if len(p.addrs) == 0 {
					p.b.Invalid = true // no ready endpoint: its share answers 500
				} else if l := lcm(scale, int64(len(p.addrs))); l <= 1<<10 {
					scale = l
				}
			default:
				p.b.Invalid = true
			}
		}
		parts = append(parts, p)
	}
	var out []ingress.HTTPBackend
	for _, p := range parts {
		w := int64(p.b.Weight) * scale
		if len(p.addrs) == 0 {
			p.b.Weight = int32(min(w, 1<<30))
			out = append(out, p.b)
			continue
		}
		for _, a := range p.addrs {
			out = append(out, ingress.HTTPBackend{Addr: a, Weight: int32(min(max(w/int64(len(p.addrs)), 1), 1<<30))})
		}
	}
	return out
}

func lcm(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
