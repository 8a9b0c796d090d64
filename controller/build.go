package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The Kind of the object a Problem is about.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
)

// Problem is something in the input that Build could not use as written: an
// invalid annotation (replaced by its last valid value, or treated as absent),
// or a Service it had to skip. Problems never stop the other Services from
// being built. A Problem is an error. Build does not log problems: it returns
// all of them on every call, and the caller reports the ones that changed.
type Problem struct {
	// Namespace and Name are the Service's, also for an EndpointSlice problem.
	Namespace string
	Name      string
	// Kind is KindService or KindEndpointSlice; Object is that object's name.
	Kind   string
	Object string
	// Annotation is the offending annotation key, or "" when the problem is
	// not about an annotation.
	Annotation string
	Err        error
}

// Error reads like "demo/web: annotation steelyard.io/weights: duplicate key
// "pod1"", with "EndpointSlice <name>: " after the Service for slice problems.
func (p Problem) Error() string {
	var sb strings.Builder
	sb.WriteString(p.Namespace + "/" + p.Name + ": ")
	if p.Kind == KindEndpointSlice {
		sb.WriteString("EndpointSlice " + p.Object + ": ")
	}
	if p.Annotation != "" {
		sb.WriteString("annotation " + p.Annotation + ": ")
	}
	if p.Err != nil {
		sb.WriteString(p.Err.Error())
	}
	return sb.String()
}

// Unwrap returns the underlying error.
func (p Problem) Unwrap() error { return p.Err }

// Builder turns Services and EndpointSlices into a dataplane.State. It is the
// one place that decides effective weights. It remembers the last valid value
// of every annotation, so a typo in one annotation keeps the previous
// behaviour instead of resetting weights. A Builder is not safe for
// concurrent use: the sync loop owns it.
//
// It keeps the objects it was given and the Service ports built from them
// per Service (cache.go): Build replaces every object and rebuilds every
// Service; Update folds in the objects that changed and rebuilds only the
// Services they touch and those that depend on them. Both give the same
// State for the same objects (TestIncrementalEqualsFullBuild).
type Builder struct {
	// families are the IP families built: IPv4, and IPv6 after EnableIPv6
	// (only for a dataplane that programs both, such as iptables.DualStack).
	families map[discoveryv1.AddressType]bool
	// NodeName is this node's name: endpoints whose nodeName is it are
	// Local (traffic policies). Empty: no endpoint is local.
	NodeName string
	// Zone is this node's topology.kubernetes.io/zone label: EndpointSlice
	// hints and trafficDistribution PreferClose keep cluster-wide traffic
	// in it. Empty: topology is not used.
	Zone string
	// routes are the Gateway API splits of the next Builds (SetRoutes).
	routes Routes
	// cache is the objects and what was built from them (cache.go).
	builderCache
}

// EnableIPv6 makes the Builder build IPv6 Service ports as well (clusterIPs
// and endpoints of that family), for a dataplane that programs both.
func (b *Builder) EnableIPv6() {
	b.families[discoveryv1.AddressTypeIPv6] = true
	b.stale = true
}

// NewBuilder returns a Builder with no memory of earlier annotations.
func NewBuilder() *Builder {
	return &Builder{
		families:     map[discoveryv1.AddressType]bool{discoveryv1.AddressTypeIPv4: true},
		builderCache: newCache(),
	}
}

// serviceInfo is a Service with its annotations resolved when it last
// changed: each annotation is parsed once per change of its object.
type serviceInfo struct {
	svc      *corev1.Service
	weights  Weights // zero when absent
	split    []SplitPart
	hasSplit bool
	// scheduler is the resolved AnnotationScheduler ("" when absent) and
	// schedProblem its Problem, reported only when the Service is built.
	scheduler    string
	schedProblem *Problem
	// memo holds, per annotation key, the parsed value in use: the last
	// valid one. Absence of an annotation counts as its valid value, so it
	// is not stored. A new object (new UID) starts without memory.
	memo map[string]any
	// problems are the annotation problems of the object itself.
	problems []Problem
}

// sliceInfo is an EndpointSlice with its weight annotations resolved.
type sliceInfo struct {
	slice *discoveryv1.EndpointSlice
	// service is the Service it belongs to (its service-name label).
	service   types.NamespacedName
	weight    uint32
	hasWeight bool
	memo      map[string]any
	problems  []Problem
}

// build is the building of one Service (or of the Gateway listeners): it
// reads the Builder's objects and collects the Problems found.
type build struct {
	b        *Builder
	problems []Problem
}

// Build returns the desired state for services and slices, sorted, and the
// problems found, sorted. It replaces every object the Builder holds (each
// annotation keeps its last valid value when its object, same UID, is still
// there). The rules, in the order they apply:
//
//   - Services: ExternalName and headless (clusterIP None) Services are
//     skipped; a Service without a valid clusterIP is skipped with a Problem.
//     Each clusterIP (clusterIPs, one per family) of a family the Builder
//     builds (IPv4; IPv6 after EnableIPv6) gives its own Service ports. TCP,
//     UDP and SCTP ports are built; an empty protocol means TCP.
//   - Entry points and policies (see externalOf): the node port (not for
//     type ClusterIP), externalIPs and load-balancer ingress IPs of the
//     clusterIP's family, loadBalancerSourceRanges, external and internal
//     traffic policies, healthCheckNodePort, ClientIP session affinity.
//   - Endpoints of a Service port: the EndpointSlices labelled with the
//     Service's name in its namespace, of the VIP's address type, having a
//     port with the same name and protocol as the Service port. Every address
//     of every endpoint is a backend; the same IP:port is kept once
//     (preferring a copy that is not terminating, as kube-proxy does).
//   - Weight of an endpoint: the Service's AnnotationWeights entry for its pod
//     name, else for its IP; else its slice's AnnotationSliceWeight, else the
//     slice's AnnotationCiliumWeight; else the Service's "*" entry; else
//     DefaultWeight.
//   - Readiness, locality and topology (kube-proxy's CategorizeEndpoints, see
//     categorize): an endpoint whose nodeName is NodeName is Local. Cluster
//     traffic goes to the ready endpoints that topology (EndpointSlice hints,
//     trafficDistribution) keeps, else to every serving and terminating one;
//     Local traffic to the ready local endpoints, else to the serving and
//     terminating local ones: each category falls back on its own. An
//     endpoint only Local traffic uses is LocalOnly. Endpoints in neither
//     category stay in the state with Weight 0, as do endpoints weighted 0
//     (drained).
//   - Split: a Service with AnnotationSplit sends its connections to the named
//     Services' endpoints (see splitBackends) instead of its own.
//   - Two Service ports with the same VIP: the first by name wins, the other
//     is dropped with a Problem.
func (b *Builder) Build(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) (dataplane.State, []Problem) {
	b.reindex(services, slices)
	b.rebuildAll()
	state, problems := b.assemble()
	log.WithFields(logrus.Fields{fieldServices: len(state.Services), fieldProblems: len(problems)}).Debug("built desired state")
	return state, problems
}

func (bd *build) problem(ns, svc, kind, object, annotation string, err error) {
	bd.problems = append(bd.problems, Problem{Namespace: ns, Name: svc, Kind: kind, Object: object, Annotation: annotation, Err: err})
}

// newServiceInfo resolves the annotations of svc; old is the Service's
// previous version (nil when new): a valid value it held survives an
// invalid annotation if it is the same object (UID).
func newServiceInfo(svc *corev1.Service, old *serviceInfo) *serviceInfo {
	si := &serviceInfo{svc: svc}
	var prev map[string]any
	if old != nil && old.svc.UID == svc.UID {
		prev = old.memo
	}
	r := resolver{kind: KindService, namespace: svc.Namespace, object: svc.Name, svcName: svc.Name, annotations: svc.Annotations, prev: prev}
	si.weights, _ = resolve(&r, AnnotationWeights, ParseWeights)
	si.split, si.hasSplit = resolve(&r, AnnotationSplit, ParseSplit)
	si.problems = r.problems
	r.problems = nil
	si.scheduler, _ = resolve(&r, AnnotationScheduler, ParseScheduler)
	if len(r.problems) > 0 {
		si.schedProblem = &r.problems[0]
	}
	si.memo = r.next
	return si
}

// newSliceInfo resolves the annotations of sl (see newServiceInfo).
func newSliceInfo(sl *discoveryv1.EndpointSlice, svcName string, old *sliceInfo) *sliceInfo {
	si := &sliceInfo{slice: sl, service: types.NamespacedName{Namespace: sl.Namespace, Name: svcName}}
	var prev map[string]any
	if old != nil && old.slice.UID == sl.UID {
		prev = old.memo
	}
	r := resolver{kind: KindEndpointSlice, namespace: sl.Namespace, object: sl.Name, svcName: svcName, annotations: sl.Annotations, prev: prev}
	// Both are resolved even when the first is present, so that each
	// keeps its memory and reports its own problem.
	mine, hasMine := resolve(&r, AnnotationSliceWeight, ParseSliceWeight)
	cilium, hasCilium := resolve(&r, AnnotationCiliumWeight, ParseSliceWeight)
	switch {
	case hasMine:
		si.weight, si.hasWeight = mine, true
	case hasCilium:
		si.weight, si.hasWeight = cilium, true
	}
	si.memo, si.problems = r.next, r.problems
	return si
}

// resolver resolves the annotations of one object.
type resolver struct {
	kind, namespace, object, svcName string
	annotations                      map[string]string
	// prev is the memory of the object's previous version, next that of
	// this one.
	prev, next map[string]any
	problems   []Problem
}

// resolve returns the value of annotation key of an object: parsed when valid;
// when invalid, a Problem and the value that was in use for the object's
// previous version (ok false if there was none, i.e. treat as absent); ok
// false when the annotation is absent.
func resolve[T any](r *resolver, key string, parse func(string) (T, error)) (v T, ok bool) {
	raw, present := r.annotations[key]
	if !present {
		return v, false
	}
	parsed, err := parse(raw)
	if err == nil {
		r.remember(key, parsed)
		return parsed, true
	}
	r.problems = append(r.problems, Problem{Namespace: r.namespace, Name: r.svcName, Kind: r.kind, Object: r.object, Annotation: key, Err: err})
	prev, had := r.prev[key]
	if !had {
		return v, false
	}
	r.remember(key, prev)
	log.WithFields(logrus.Fields{fieldSvc: r.namespace + "/" + r.svcName, fieldAnnotation: key}).
		Debugf("%s %s has an invalid annotation, using its last valid value", r.kind, r.object)
	return prev.(T), true
}

func (r *resolver) remember(key string, v any) {
	if r.next == nil {
		r.next = map[string]any{}
	}
	r.next[key] = v
}

// servicePorts builds the ports of one Service, or nothing when it is skipped.
func (bd *build) servicePorts(si *serviceInfo) []dataplane.ServicePort {
	svc := si.svc
	l := log.WithField(fieldSvc, svc.Namespace+"/"+svc.Name)
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		l.Debug("ExternalName Service skipped")
		return nil
	case svc.Spec.ClusterIP == corev1.ClusterIPNone:
		l.Debug("headless Service skipped")
		return nil
	case svc.Spec.ClusterIP == "":
		// The API server always allocates one; a manifest must set it,
		// because the standalone mode has no allocator.
		bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("no clusterIP, Service skipped"))
		return nil
	}
	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 || clusterIPs[0] != svc.Spec.ClusterIP {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	var out []dataplane.ServicePort
	for i, raw := range clusterIPs {
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" {
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("invalid clusterIP %q, Service skipped", raw))
			if i == 0 {
				return nil
			}
			continue
		}
		family := addressTypeOf(ip)
		if !bd.b.families[family] {
			l.WithField(fieldVIP, ip).Debugf("%s clusterIP not supported, skipped", family)
			continue
		}
		out = append(out, bd.familyPorts(si, ip)...)
	}
	// The IPVS scheduler annotation is resolved once per Service, so a bad
	// value is one Problem whatever the number of ports and families.
	if si.schedProblem != nil {
		bd.problems = append(bd.problems, *si.schedProblem)
	}
	for i := range out {
		out[i].Scheduler = si.scheduler
	}
	return out
}

// familyPorts builds the ports of one Service for one of its clusterIPs.
func (bd *build) familyPorts(si *serviceInfo, ip netip.Addr) []dataplane.ServicePort {
	svc := si.svc
	l := log.WithField(fieldSvc, svc.Namespace+"/"+svc.Name)
	family := addressTypeOf(ip)
	ext := bd.externalOf(si, ip)
	var out []dataplane.ServicePort
	seen := map[string]bool{}
	for _, port := range svc.Spec.Ports {
		pl := l.WithField(fieldPort, portName(port))
		if seen[portName(port)] {
			// Only manifests can do this; the API server requires unique
			// names. Names must be unique for a deterministic State.
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("port %q: name used twice, port skipped", portName(port)))
			continue
		}
		seen[portName(port)] = true
		proto, ok := protocolOf(port.Protocol)
		if !ok {
			pl.Debugf("protocol %s not supported, port skipped", port.Protocol)
			continue
		}
		if port.Port < 1 || port.Port > 65535 {
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("port %q: number %d out of range, port skipped", portName(port), port.Port))
			continue
		}
		sp := ext
		sp.Name = dataplane.ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: portName(port)}
		sp.VIP = dataplane.VIP{IP: ip, Port: uint16(port.Port), Protocol: proto}
		if port.NodePort > 0 && port.NodePort <= 65535 && svc.Spec.Type != corev1.ServiceTypeClusterIP {
			sp.NodePort = uint16(port.NodePort)
		}
		if r := bd.serviceRoute(si, port); r != nil {
			// A route with this Service as parent is the standard form
			// of the split annotation, and wins over it.
			if si.hasSplit {
				bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, AnnotationSplit, errRouteWins(port, r.Route))
			}
			sp.Name.Port = routePortName(port, r.Route)
			sp.Backends, sp.RejectWeight = bd.routeBackends(sp.Name.String(), r.Backends, proto, family)
		} else if si.hasSplit {
			sp.Backends = bd.splitBackends(si, port, family)
		} else {
			sp.Backends = bd.backends(si, port, family)
		}
		out = append(out, sp)
	}
	return out
}

// DefaultAffinitySeconds is sessionAffinity ClientIP's timeout when the
// Service does not set one (the API server's default).
const DefaultAffinitySeconds = 10800

// externalOf returns the per-Service fields of a ServicePort (entry points
// and policies) for the clusterIP ip; addresses of the other family are
// left to that family's ServicePort.
func (bd *build) externalOf(si *serviceInfo, ip netip.Addr) dataplane.ServicePort {
	svc := si.svc
	var sp dataplane.ServicePort
	sameFamily := func(raw, what string) (netip.Addr, bool) {
		a, err := netip.ParseAddr(strings.TrimSpace(raw))
		if err != nil || a.Zone() != "" {
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("%s %q is not an IP address, ignored", what, raw))
			return netip.Addr{}, false
		}
		return a, a.Is4() == ip.Is4()
	}
	for _, raw := range svc.Spec.ExternalIPs {
		if a, ok := sameFamily(raw, "externalIP"); ok && !slices.Contains(sp.ExternalIPs, a) {
			sp.ExternalIPs = append(sp.ExternalIPs, a)
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			// ipMode Proxy: the load balancer delivers to the node with its
			// own address as destination, so the node must not capture
			// the IP (kube-proxy skips it too).
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy) {
				continue
			}
			if a, ok := sameFamily(ing.IP, "load-balancer ingress IP"); ok && !slices.Contains(sp.LoadBalancerIPs, a) {
				sp.LoadBalancerIPs = append(sp.LoadBalancerIPs, a)
			}
		}
		for _, raw := range svc.Spec.LoadBalancerSourceRanges {
			p, err := netip.ParsePrefix(strings.TrimSpace(raw))
			if err != nil {
				bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("loadBalancerSourceRanges %q: %w, ignored", raw, err))
				continue
			}
			if p.Addr().Is4() == ip.Is4() {
				sp.SourceRanges = append(sp.SourceRanges, p.Masked())
			}
		}
	}
	external := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer || len(svc.Spec.ExternalIPs) > 0
	sp.ExternalLocal = external && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	sp.InternalLocal = svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if sp.ExternalLocal && svc.Spec.HealthCheckNodePort > 0 && svc.Spec.HealthCheckNodePort <= 65535 {
		sp.HealthCheckNodePort = uint16(svc.Spec.HealthCheckNodePort)
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		sp.AffinitySeconds = DefaultAffinitySeconds
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			sp.AffinitySeconds = int(*c.ClientIP.TimeoutSeconds)
		}
	}
	return sp
}

// backends returns the endpoints of one Service port with their weights, the
// readiness and topology rules applied (categorize).
func (bd *build) backends(si *serviceInfo, port corev1.ServicePort, family discoveryv1.AddressType) []dataplane.Backend {
	proto, _ := protocolOf(port.Protocol)
	sls := bd.b.slices[types.NamespacedName{Namespace: si.svc.Namespace, Name: si.svc.Name}]
	// Sized for every address: the Builder keeps these Backends, and
	// growing them by append left 10 Backends in an array of 16, 6 MiB of
	// the heap kept at 10,000 Services x 10 (BenchmarkHeapAfterFirstSync10kx10).
	n := 0
	for _, sl := range sls {
		if sl.slice.AddressType == family {
			for i := range sl.slice.Endpoints {
				n += len(sl.slice.Endpoints[i].Addresses)
			}
		}
	}
	var out []dataplane.Backend // nil without endpoints, as before
	// hints[i] are the zones out[i] is hinted for (nil: no hint).
	var hints [][]string
	if n > 0 {
		out, hints = make([]dataplane.Backend, 0, n), make([][]string, 0, n)
	}
	// Duplicates are found by a scan while the port has few endpoints: a
	// map per port was 7 MB of a Build's garbage at 10,000 Services x 10.
	var index map[netip.AddrPort]int
	if n > smallBackends {
		index = make(map[netip.AddrPort]int, n)
	}
	find := func(a netip.AddrPort) (int, bool) {
		if index != nil {
			i, ok := index[a]
			return i, ok
		}
		for i := range out {
			if out[i].Addr() == a {
				return i, true
			}
		}
		return 0, false
	}
	for _, sl := range sls {
		if sl.slice.AddressType != family {
			continue
		}
		target, ok := slicePort(sl.slice, port.Name, proto)
		if !ok {
			continue
		}
		for _, ep := range sl.slice.Endpoints {
			// Nil conditions are "unknown"; the API says to read them so.
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ready
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			name := ""
			if ep.TargetRef != nil {
				name = ep.TargetRef.Name
			}
			var nodeName, zone string
			if ep.NodeName != nil {
				nodeName = *ep.NodeName
			}
			if ep.Zone != nil {
				zone = *ep.Zone
			}
			var zoneHints []string
			if ep.Hints != nil {
				for _, z := range ep.Hints.ForZones {
					zoneHints = append(zoneHints, z.Name)
				}
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil || ip.Zone() != "" || addressTypeOf(ip) != family {
					log.WithFields(logrus.Fields{fieldSlice: sl.slice.Namespace + "/" + sl.slice.Name, fieldBackend: a}).
						Debugf("endpoint address is not a valid %s address, ignored", family)
					continue
				}
				be := dataplane.Backend{
					IP:          ip,
					Port:        target,
					Name:        name,
					Weight:      float64(endpointWeight(si, sl, name, ip)),
					Ready:       ready,
					Serving:     serving,
					Terminating: terminating,
					NodeName:    nodeName,
					Zone:        zone,
					Local:       bd.b.NodeName != "" && nodeName == bd.b.NodeName,
				}
				if i, dup := find(be.Addr()); dup {
					// The same IP:port in two slices (an endpoint moving
					// between slices, or a pod IP reused while the old pod
					// terminates): prefer the copy that is not terminating.
					if out[i].Terminating && !be.Terminating {
						out[i], hints[i] = be, zoneHints
					}
					continue
				}
				if index != nil {
					index[be.Addr()] = len(out)
				}
				out = append(out, be)
				hints = append(hints, zoneHints)
			}
		}
	}
	bd.categorize(si, out, hints)
	return out
}

// smallBackends is the most endpoints a port's duplicates are looked for
// by a scan instead of a map.
const smallBackends = 32

// endpointWeight is the configured weight of one endpoint (see Build).
func endpointWeight(si *serviceInfo, sl *sliceInfo, pod string, ip netip.Addr) uint32 {
	if w, ok := si.weights.Named(pod, ip); ok {
		return w
	}
	if sl.hasWeight {
		return sl.weight
	}
	if si.weights.HasDefault {
		return si.weights.Default
	}
	return DefaultWeight
}

// splitBackends returns the backends of port of Service x, which has a split:
// for each named Service S of x's namespace, the endpoints of S's port that
// matches (see splitPort), weighted by S's own annotations with the readiness
// rule applied within S, and scaled so that S receives its part:
//
//	effective weight of e = part_S * w_e / (sum of w in S)
//
// A missing Service, one without a matching port, or one whose weights are
// all 0 contributes nothing, so the others share its part (dataplanes
// normalise by the total). Its endpoints, if any, stay with Weight 0 so
// established connections can drain. x may name itself; the named Services'
// own splits are not followed. An endpoint reached through two named Services
// is one backend with the sum of its weights.
func (bd *build) splitBackends(x *serviceInfo, port corev1.ServicePort, family discoveryv1.AddressType) []dataplane.Backend {
	l := log.WithFields(logrus.Fields{fieldSvc: x.svc.Namespace + "/" + x.svc.Name, fieldPort: portName(port)})
	var out []dataplane.Backend
	index := map[netip.AddrPort]int{}
	for _, part := range x.split {
		s := bd.b.services[types.NamespacedName{Namespace: x.svc.Namespace, Name: part.Service}]
		if s == nil {
			l.Debugf("split names Service %q, which does not exist", part.Service)
			continue
		}
		sp := port
		if s != x {
			var ok bool
			if sp, ok = splitPort(port, s.svc.Spec.Ports); !ok {
				l.Debugf("split names Service %q, which has no matching port", part.Service)
				continue
			}
		}
		out = addPart(out, index, bd.backends(s, sp, family), part.Weight)
	}
	return out
}

// splitPort returns the port of a split target that serves x's port: the one
// with the same name and protocol, else the target's only port if its
// protocol matches.
func splitPort(x corev1.ServicePort, ports []corev1.ServicePort) (corev1.ServicePort, bool) {
	proto, _ := protocolOf(x.Protocol)
	for _, p := range ports {
		if pp, _ := protocolOf(p.Protocol); p.Name == x.Name && pp == proto {
			return p, true
		}
	}
	if len(ports) == 1 {
		if pp, _ := protocolOf(ports[0].Protocol); pp == proto {
			return ports[0], true
		}
	}
	return corev1.ServicePort{}, false
}

// slicePort returns the port number that a slice gives to the Service port
// with this name and protocol.
func slicePort(sl *discoveryv1.EndpointSlice, name string, proto dataplane.Protocol) (uint16, bool) {
	for _, p := range sl.Ports {
		pName := ""
		if p.Name != nil {
			pName = *p.Name
		}
		var pProto dataplane.Protocol = dataplane.TCP
		if p.Protocol != nil {
			var ok bool
			if pProto, ok = protocolOf(*p.Protocol); !ok {
				continue
			}
		}
		if pName != name || pProto != proto {
			continue
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			log.WithFields(logrus.Fields{fieldSlice: sl.Namespace + "/" + sl.Name, fieldPort: pName}).
				Debug("EndpointSlice port has no valid number, slice ignored for this port")
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

// portName is the ServicePortName.Port of a Service port: its name, or its
// number when unnamed.
func portName(p corev1.ServicePort) string {
	if p.Name != "" {
		return p.Name
	}
	return strconv.Itoa(int(p.Port))
}

// protocolOf maps a Kubernetes protocol to a dataplane one. Empty means TCP:
// objects from manifests are not defaulted by an API server.
func protocolOf(p corev1.Protocol) (dataplane.Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return dataplane.TCP, true
	case corev1.ProtocolUDP:
		return dataplane.UDP, true
	case corev1.ProtocolSCTP:
		return dataplane.SCTP, true
	}
	return "", false
}

// addressTypeOf is the EndpointSlice address type of ip's family.
func addressTypeOf(ip netip.Addr) discoveryv1.AddressType {
	if ip.Is4() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeIPv6
}

func sortProblems(ps []Problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		a, b := ps[i], ps[j]
		switch {
		case a.Namespace != b.Namespace:
			return a.Namespace < b.Namespace
		case a.Name != b.Name:
			return a.Name < b.Name
		case a.Kind != b.Kind:
			return kindRank(a.Kind) < kindRank(b.Kind)
		case a.Object != b.Object:
			return a.Object < b.Object
		case a.Annotation != b.Annotation:
			return a.Annotation < b.Annotation
		}
		return a.Error() < b.Error()
	})
}

// kindRank puts a Service's own problems before those of its slices.
func kindRank(kind string) int {
	if kind == KindService {
		return 0
	}
	return 1
}
