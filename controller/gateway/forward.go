package gateway

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
)

// DefaultHTTPPortBase is the first port nginx serves HTTP listeners on.
// 61000 and up is above Linux's default ephemeral range (32768-60999), so
// no outgoing connection of the node holds one.
const DefaultHTTPPortBase = 61000

// nginxPorts gives every HTTP listener the port nginx serves it on: one per
// Gateway and listener port, in the order of Gateway age, so a new Gateway
// never moves an older one's port. nginx tells Gateways apart by that port:
// the forward below rewrites the Gateway address, so nginx cannot see it.
func nginxPorts(gws []*gwv1.Gateway, listeners map[types.NamespacedName][]*listener, base int32) {
	if base == 0 {
		base = DefaultHTTPPortBase
	}
	next := base
	for _, g := range gws {
		byPort := map[gwv1.PortNumber]int32{}
		for _, l := range listeners[nn(&g.ObjectMeta)] {
			if !l.http {
				continue
			}
			p, ok := byPort[l.spec.Port]
			if !ok {
				if next > 65535 {
					continue // no port left: the listener gets no forward
				}
				p, byPort[l.spec.Port] = next, next
				next++
			}
			l.nginxPort = p
		}
	}
}

// httpForwards returns the kernel side of the HTTP listeners: each Gateway
// address and listener port is a Service port of its own whose one backend
// is this node's address (of the same family) at the listener's nginx
// port. So every dataplane DNATs the Gateway address to the local nginx
// with the code that serves Service VIPs, on every node, and nginx routes
// by the HTTPRoutes. The result differs per node (its own address); status
// does not depend on it.
func httpForwards(gws []*gwv1.Gateway, listeners map[types.NamespacedName][]*listener, addrs map[types.NamespacedName][]netip.Addr,
	node []netip.Addr) []controller.ListenerRoute {
	var out []controller.ListenerRoute
	for _, g := range gws {
		done := map[int32]bool{}
		for _, l := range listeners[nn(&g.ObjectMeta)] {
			if !l.http || !l.valid || l.nginxPort == 0 || done[l.nginxPort] {
				continue
			}
			done[l.nginxPort] = true
			for _, a := range addrs[nn(&g.ObjectMeta)] {
				local, ok := sameFamily(node, a)
				if !ok {
					continue
				}
				out = append(out, controller.ListenerRoute{
					Name: dataplane.ServicePortName{Namespace: g.Namespace, Name: g.Name, Port: string(l.spec.Name) + "/nginx"},
					VIP:  dataplane.VIP{IP: a, Port: uint16(l.spec.Port), Protocol: dataplane.TCP},
					Local: []dataplane.Backend{{IP: local, Port: uint16(l.nginxPort), Name: "nginx", Weight: 1,
						Ready: true, Serving: true}},
				})
			}
		}
	}
	return out
}

// sameFamily returns the first of addrs in a's IP family.
func sameFamily(addrs []netip.Addr, a netip.Addr) (netip.Addr, bool) {
	for _, n := range addrs {
		if n.Unmap().Is4() == a.Unmap().Is4() {
			return n.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
