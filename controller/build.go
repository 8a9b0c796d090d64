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
	// lastValid holds, per object (by UID) and annotation, the parsed value in
	// use after the previous Build. Rebuilt on every Build, which prunes
	// objects that disappeared; absence of an annotation counts as its valid
	// value, so it is not stored.
	lastValid map[annotationRef]any
	// routes are the Gateway API splits of the next Builds (SetRoutes).
	routes Routes
}

// EnableIPv6 makes the Builder build IPv6 Service ports as well (clusterIPs
// and endpoints of that family), for a dataplane that programs both.
func (b *Builder) EnableIPv6() {
	b.families[discoveryv1.AddressTypeIPv6] = true
}

// NewBuilder returns a Builder with no memory of earlier annotations.
func NewBuilder() *Builder {
	return &Builder{
		families:  map[discoveryv1.AddressType]bool{discoveryv1.AddressTypeIPv4: true},
		lastValid: map[annotationRef]any{},
	}
}

// annotationRef identifies one annotation of one object. The UID makes a
// Service that was deleted and recreated between two Builds start fresh.
type annotationRef struct {
	kind, namespace, name string
	uid                   types.UID
	key                   string
}

// serviceInfo is a Service with its annotations resolved for this Build.
type serviceInfo struct {
	svc      *corev1.Service
	weights  Weights // zero when absent
	split    []SplitPart
	hasSplit bool
}

// sliceInfo is an EndpointSlice with its weight annotations resolved.
type sliceInfo struct {
	slice     *discoveryv1.EndpointSlice
	weight    uint32
	hasWeight bool
}

// build is the state of one Build call.
type build struct {
	b        *Builder
	next     map[annotationRef]any
	problems []Problem
	services map[types.NamespacedName]*serviceInfo
	// slices are grouped by the Service they belong to, sorted by name.
	slices map[types.NamespacedName][]*sliceInfo
}

// Build returns the desired state for services and slices, sorted, and the
// problems found, sorted. The rules, in the order they apply:
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
//   - Readiness (kube-proxy's rule): only ready endpoints receive new
//     connections; when none is ready, the serving and terminating ones do.
//     Other endpoints stay in the state with Weight 0, as do endpoints
//     weighted 0 (drained).
//   - Locality and topology: an endpoint whose nodeName is NodeName is
//     Local; with a Zone, EndpointSlice hints (or trafficDistribution
//     PreferClose) mark the others OutOfZone (see applyTopology).
//   - Split: a Service with AnnotationSplit sends its connections to the named
//     Services' endpoints (see splitBackends) instead of its own.
//   - Two Service ports with the same VIP: the first by name wins, the other
//     is dropped with a Problem.
func (b *Builder) Build(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) (dataplane.State, []Problem) {
	bd := &build{
		b:        b,
		next:     map[annotationRef]any{},
		services: map[types.NamespacedName]*serviceInfo{},
		slices:   map[types.NamespacedName][]*sliceInfo{},
	}
	// Resolve the annotations of every object, including Services that are
	// not built (headless ones can still be split targets), so that each
	// annotation's memory survives the Builds in which it is not used.
	bd.indexServices(services)
	bd.indexSlices(slices)

	keys := make([]types.NamespacedName, 0, len(bd.services))
	for k := range bd.services {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })

	var state dataplane.State
	for _, k := range keys {
		state.Services = append(state.Services, bd.servicePorts(bd.services[k])...)
	}
	state.Services = append(state.Services, bd.listenerPorts()...)
	state.Sort()
	state.Services = bd.dropDuplicateVIPs(state.Services)

	b.lastValid = bd.next
	sortProblems(bd.problems)
	log.WithFields(logrus.Fields{fieldServices: len(state.Services), fieldProblems: len(bd.problems)}).Debug("built desired state")
	return state, bd.problems
}

func (bd *build) problem(ns, svc, kind, object, annotation string, err error) {
	bd.problems = append(bd.problems, Problem{Namespace: ns, Name: svc, Kind: kind, Object: object, Annotation: annotation, Err: err})
}

func (bd *build) indexServices(services []*corev1.Service) {
	for _, svc := range services {
		if svc == nil {
			continue
		}
		key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		if _, dup := bd.services[key]; dup {
			// Only the manifest source can produce this (the same Service in
			// two files); the API server cannot.
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("duplicate Service, the first one is used"))
			continue
		}
		si := &serviceInfo{svc: svc}
		ref := annotationRef{kind: KindService, namespace: svc.Namespace, name: svc.Name, uid: svc.UID}
		si.weights, _ = resolve(bd, ref, AnnotationWeights, svc.Name, svc.Annotations, ParseWeights)
		si.split, si.hasSplit = resolve(bd, ref, AnnotationSplit, svc.Name, svc.Annotations, ParseSplit)
		bd.services[key] = si
	}
}

func (bd *build) indexSlices(slices []*discoveryv1.EndpointSlice) {
	seen := map[types.NamespacedName]bool{}
	for _, sl := range slices {
		if sl == nil {
			continue
		}
		svcName := sl.Labels[discoveryv1.LabelServiceName]
		if svcName == "" {
			log.WithField(fieldSlice, sl.Namespace+"/"+sl.Name).Debug("EndpointSlice has no service-name label, ignored")
			continue
		}
		own := types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}
		if seen[own] {
			bd.problem(sl.Namespace, svcName, KindEndpointSlice, sl.Name, "", fmt.Errorf("duplicate EndpointSlice, the first one is used"))
			continue
		}
		seen[own] = true
		si := &sliceInfo{slice: sl}
		ref := annotationRef{kind: KindEndpointSlice, namespace: sl.Namespace, name: sl.Name, uid: sl.UID}
		// Both are resolved even when the first is present, so that each
		// keeps its memory and reports its own problem.
		mine, hasMine := resolve(bd, ref, AnnotationSliceWeight, svcName, sl.Annotations, ParseSliceWeight)
		cilium, hasCilium := resolve(bd, ref, AnnotationCiliumWeight, svcName, sl.Annotations, ParseSliceWeight)
		switch {
		case hasMine:
			si.weight, si.hasWeight = mine, true
		case hasCilium:
			si.weight, si.hasWeight = cilium, true
		}
		key := types.NamespacedName{Namespace: sl.Namespace, Name: svcName}
		bd.slices[key] = append(bd.slices[key], si)
	}
	// Slice order decides which copy of a duplicate endpoint is kept.
	for _, list := range bd.slices {
		sort.Slice(list, func(i, j int) bool { return list[i].slice.Name < list[j].slice.Name })
	}
}

// resolve returns the value of annotation key of an object: parsed when valid;
// when invalid, a Problem and the value that was in use after the previous
// Build (ok false if there was none, i.e. treat as absent); ok false when the
// annotation is absent.
func resolve[T any](bd *build, ref annotationRef, key, svcName string, annotations map[string]string, parse func(string) (T, error)) (v T, ok bool) {
	raw, present := annotations[key]
	if !present {
		return v, false
	}
	ref.key = key
	parsed, err := parse(raw)
	if err == nil {
		bd.next[ref] = parsed
		return parsed, true
	}
	bd.problem(ref.namespace, svcName, ref.kind, ref.name, key, err)
	prev, had := bd.b.lastValid[ref]
	if !had {
		return v, false
	}
	bd.next[ref] = prev
	log.WithFields(logrus.Fields{fieldSvc: ref.namespace + "/" + svcName, fieldAnnotation: key}).
		Debugf("%s %s has an invalid annotation, using its last valid value", ref.kind, ref.name)
	return prev.(T), true
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
	sched := bd.scheduler(si)
	for i := range out {
		out[i].Scheduler = sched
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
// readiness rule applied.
func (bd *build) backends(si *serviceInfo, port corev1.ServicePort, family discoveryv1.AddressType) []dataplane.Backend {
	proto, _ := protocolOf(port.Protocol)
	var out []dataplane.Backend
	// hints[i] are the zones out[i] is hinted for (nil: no hint).
	var hints [][]string
	index := map[netip.AddrPort]int{}
	for _, sl := range bd.slices[types.NamespacedName{Namespace: si.svc.Namespace, Name: si.svc.Name}] {
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
				if i, dup := index[be.Addr()]; dup {
					// The same IP:port in two slices (an endpoint moving
					// between slices, or a pod IP reused while the old pod
					// terminates): prefer the copy that is not terminating.
					if out[i].Terminating && !be.Terminating {
						out[i], hints[i] = be, zoneHints
					}
					continue
				}
				index[be.Addr()] = len(out)
				out = append(out, be)
				hints = append(hints, zoneHints)
			}
		}
	}
	applyReadiness(out)
	bd.applyTopology(si, out, hints)
	return out
}

// applyTopology marks OutOfZone the endpoints that topology keeps
// cluster-wide traffic away from, the way kube-proxy reads hints: only when
// this node has a zone, every usable endpoint carries zone hints, and at
// least one is hinted for this zone; then only those get cluster-wide
// traffic. trafficDistribution PreferClose without hints (no EndpointSlice
// controller filled them, as with manifests) hints each endpoint for its own
// zone, which is what that controller does. Weights then apply among the
// endpoints that remain.
func (bd *build) applyTopology(si *serviceInfo, bs []dataplane.Backend, hints [][]string) {
	var td string
	if si.svc.Spec.TrafficDistribution != nil {
		td = *si.svc.Spec.TrafficDistribution
	}
	// PreferSameNode (KEP-3015): this node's endpoints when it has one,
	// else the same as PreferSameZone.
	if td == corev1.ServiceTrafficDistributionPreferSameNode && bd.b.NodeName != "" {
		anyLocal := false
		for _, b := range bs {
			anyLocal = anyLocal || b.Weight > 0 && b.Local
		}
		if anyLocal {
			for i := range bs {
				bs[i].OutOfZone = bs[i].Weight > 0 && !bs[i].Local
			}
			return
		}
	}
	zone := bd.b.Zone
	if zone == "" {
		return
	}
	// PreferSameZone is PreferClose's GA name.
	preferClose := td == corev1.ServiceTrafficDistributionPreferClose || td == corev1.ServiceTrafficDistributionPreferSameZone ||
		td == corev1.ServiceTrafficDistributionPreferSameNode
	inZone := make([]bool, len(bs))
	anyInZone := false
	for i, b := range bs {
		if b.Weight <= 0 {
			continue
		}
		h := hints[i]
		if len(h) == 0 && preferClose && b.Zone != "" {
			h = []string{b.Zone}
		}
		if len(h) == 0 {
			// One usable endpoint without hints: topology is off.
			return
		}
		if slices.Contains(h, zone) {
			inZone[i], anyInZone = true, true
		}
	}
	if !anyInZone {
		return
	}
	for i := range bs {
		bs[i].OutOfZone = bs[i].Weight > 0 && !inZone[i]
	}
}

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

// applyReadiness zeroes the weight of the endpoints that must not receive new
// connections: kube-proxy's rule, so a rollout behaves the same as without
// steelyard. The endpoints stay, so established connections can drain.
func applyReadiness(bs []dataplane.Backend) {
	anyReady := false
	for _, b := range bs {
		if b.Ready {
			anyReady = true
			break
		}
	}
	for i := range bs {
		use := bs[i].Ready
		if !anyReady {
			// Fallback: keep serving through pods that are shutting down
			// but still able to, rather than refusing connections.
			use = bs[i].Serving && bs[i].Terminating
		}
		if !use {
			bs[i].Weight = 0
		}
	}
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
		s := bd.services[types.NamespacedName{Namespace: x.svc.Namespace, Name: part.Service}]
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

// dropDuplicateVIPs keeps the first Service port (in name order) of each VIP.
// Only manifests can produce duplicates; a dataplane cannot program them.
func (bd *build) dropDuplicateVIPs(sps []dataplane.ServicePort) []dataplane.ServicePort {
	owner := map[dataplane.VIP]dataplane.ServicePortName{}
	out := sps[:0]
	for _, sp := range sps {
		if first, dup := owner[sp.VIP]; dup {
			bd.problem(sp.Name.Namespace, sp.Name.Name, KindService, sp.Name.Name, "",
				fmt.Errorf("port %s: VIP %s is already used by %s, port skipped", sp.Name.Port, sp.VIP, first))
			continue
		}
		owner[sp.VIP] = sp.Name
		out = append(out, sp)
	}
	return out
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
