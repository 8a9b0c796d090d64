package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Routes are the weighted splits that Gateway API routes ask for
// (controller/gateway translates them). The Builder turns them into
// Service ports through the same code as AnnotationSplit, so a route
// weight change takes the sync path of an annotation change and every
// dataplane serves routes unchanged.
type Routes struct {
	// Listeners are Gateway listeners with the route attached to them:
	// each is a Service port of its own whose VIP is the Gateway address.
	Listeners []ListenerRoute
	// Services are routes whose parent is a Service (GAMMA): the Service's
	// own VIP splits by the route's backends, instead of its endpoints or
	// its AnnotationSplit.
	Services []ServiceRoute
}

// RouteBackend is one backendRef of a route: a port of a Service, and the
// share of the route's connections it gets (Weight / sum of the route's
// weights). Invalid is true when the reference cannot be used (missing
// Service, refused by ReferenceGrant, wrong kind): its share is kept and
// its connections fail, as the Gateway API requires.
type RouteBackend struct {
	Namespace, Service string
	// Port is the Service port number (backendRef port).
	Port    int32
	Weight  uint32
	Invalid bool
}

// ListenerRoute is one Gateway listener address with its route.
type ListenerRoute struct {
	// Name is what explain shows: namespace/gateway:listener/kind/route.
	Name     dataplane.ServicePortName
	VIP      dataplane.VIP
	Backends []RouteBackend
	// Local, when set, are the listener's backends as they are, instead
	// of Backends: this node's own nginx for an HTTP listener (the
	// Gateway address's port forwarded to the port nginx serves it on).
	Local []dataplane.Backend
}

// ServiceRoute is a route whose parentRef is a Service port.
type ServiceRoute struct {
	Service types.NamespacedName
	// Port is the parentRef port; 0 for every port of Protocol.
	Port     int32
	Protocol dataplane.Protocol
	// Route is "Kind/namespace/name", carried into the port's name.
	Route    string
	Backends []RouteBackend
}

// serviceNames returns the Services whose ports the routes make or change:
// each listener's Gateway and each parent Service.
func (r Routes) serviceNames() map[dataplane.ServiceName]bool {
	out := make(map[dataplane.ServiceName]bool, len(r.Listeners)+len(r.Services))
	for _, l := range r.Listeners {
		out[l.Name.Service()] = true
	}
	for _, s := range r.Services {
		out[dataplane.ServiceName{Namespace: s.Service.Namespace, Name: s.Service.Name}] = true
	}
	return out
}

// serviceRoute returns the route for port of Service si, if any.
func (bd *build) serviceRoute(si *serviceInfo, port corev1.ServicePort) *ServiceRoute {
	proto, _ := protocolOf(port.Protocol)
	for i := range bd.b.routes.Services {
		r := &bd.b.routes.Services[i]
		if r.Service.Namespace == si.svc.Namespace && r.Service.Name == si.svc.Name &&
			r.Protocol == proto && (r.Port == 0 || r.Port == port.Port) {
			return r
		}
	}
	return nil
}

// listenerPorts builds the Service ports of Gateway listeners.
func (bd *build) listenerPorts() []dataplane.ServicePort {
	var out []dataplane.ServicePort
	for _, lr := range bd.b.routes.Listeners {
		family := addressTypeOf(lr.VIP.IP)
		if !bd.b.families[family] {
			continue
		}
		sp := dataplane.ServicePort{Name: lr.Name, VIP: lr.VIP}
		if len(lr.Local) > 0 {
			sp.Backends = slices.Clone(lr.Local)
			out = append(out, sp)
			continue
		}
		sp.Backends, sp.RejectWeight = bd.routeBackends(lr.Name.String(), lr.Backends, lr.VIP.Protocol, family)
		out = append(out, sp)
	}
	return out
}

// routeBackends returns the backends of a route: each backendRef's Service
// port endpoints, weighted within it by steelyard's endpoint weights, and
// scaled to the backendRef's part exactly as splitBackends scales a split
// part. The parts of invalid backendRefs (RouteBackend.Invalid, or a
// Service or port that does not exist) add up to reject: the spec wants
// their share kept and its connections refused, not handed to the valid
// backends. A valid backendRef with no ready endpoint keeps no share, as
// a Service without endpoints gets none in a split.
func (bd *build) routeBackends(route string, refs []RouteBackend, proto dataplane.Protocol, family discoveryv1.AddressType) (out []dataplane.Backend, reject float64) {
	index := map[netip.AddrPort]int{}
	for _, ref := range refs {
		if ref.Invalid {
			reject += float64(ref.Weight)
			continue
		}
		s := bd.b.services[types.NamespacedName{Namespace: ref.Namespace, Name: ref.Service}]
		if s == nil {
			log.WithField(fieldSvc, route).Debugf("route names Service %s/%s, which does not exist", ref.Namespace, ref.Service)
			reject += float64(ref.Weight)
			continue
		}
		port, ok := servicePortByNumber(s.svc, ref.Port, proto)
		if !ok {
			log.WithField(fieldSvc, route).Debugf("route names port %d of Service %s/%s, which has none", ref.Port, ref.Namespace, ref.Service)
			reject += float64(ref.Weight)
			continue
		}
		out = addPart(out, index, bd.backends(s, port, family), ref.Weight)
	}
	return out, reject
}

// addPart appends bes to out, scaled so that together they weigh part:
// effective weight of e = part * w_e / (sum of w over the cluster endpoints
// of bes). The sum leaves out LocalOnly endpoints, so cluster traffic gives
// each part its share whatever topology or the terminating fallback keeps
// for Local traffic. An endpoint already in out (reached through two parts)
// gets the sum of its weights, and is LocalOnly only if it is in both.
func addPart(out []dataplane.Backend, index map[netip.AddrPort]int, bes []dataplane.Backend, part uint32) []dataplane.Backend {
	var sum float64
	for _, be := range bes {
		if !be.LocalOnly {
			sum += be.Weight
		}
	}
	for _, be := range bes {
		if part == 0 || sum == 0 {
			be.Weight = 0
		} else {
			// Weights are integers < 2^16, so this is exact up to the
			// final division; tests compare with the same expression.
			be.Weight = float64(part) * be.Weight / sum
		}
		if i, dup := index[be.Addr()]; dup {
			out[i].Weight += be.Weight
			out[i].LocalOnly = out[i].LocalOnly && be.LocalOnly
			continue
		}
		index[be.Addr()] = len(out)
		out = append(out, be)
	}
	return out
}

// servicePortByNumber returns the port of svc with this number and protocol.
func servicePortByNumber(svc *corev1.Service, number int32, proto dataplane.Protocol) (corev1.ServicePort, bool) {
	for _, p := range svc.Spec.Ports {
		if pp, ok := protocolOf(p.Protocol); ok && pp == proto && p.Port == number {
			return p, true
		}
	}
	return corev1.ServicePort{}, false
}

// routePortName is the ServicePortName.Port of a Service port that a route
// splits: the port's own name, then the route, so explain shows both.
func routePortName(port corev1.ServicePort, route string) string {
	return portName(port) + "/" + route
}

// ErrRouteWins marks the Problem of a Service that has both AnnotationSplit
// and a route with it as parent (Event reason ReasonRouteWins).
var ErrRouteWins = errors.New("wins over the annotation")

func errRouteWins(port corev1.ServicePort, route string) error {
	return fmt.Errorf("port %s: %s has this Service as parent and %w", strconv.Quote(portName(port)), route, ErrRouteWins)
}

// ProgrammedNotifier is a RouteSource told after each sync that the
// dataplane applied: the routes of the last Routes call are then in the
// kernel of this node.
type ProgrammedNotifier interface {
	Programmed()
}
