package controller

import (
	"fmt"
	"reflect"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The Builder's cache, kube-proxy's ServicePortMap and EndpointsMap in one:
// the objects last given (annotations resolved), the Service ports built
// from them per Service, and the indexes that say which Services an object
// change touches. A change costs the Services it touches, not the cluster:
// at 10,000 Services x 10 endpoints a full Build allocates about 92 MB
// (BenchmarkBuild10kx10), while one endpoint change rebuilds one Service.
//
// What a Service's ports read, and so what rebuilds it:
//   - the Service and its EndpointSlices (by the service-name label);
//   - with AnnotationSplit, each named Service's ports, weights and slices
//     (splitParents), one level deep as splitBackends reads them;
//   - a route with it as parent (routes.Services), and each Service a
//     route's backendRef names (routeParents);
//   - the node's zone, name and the families built: a change of those is
//     rare and rebuilds every Service (from the cache, no parsing).
//
// Gateway listener ports are few and built on every Update.

// builderCache is the part of the Builder that persists between Builds.
type builderCache struct {
	services map[types.NamespacedName]*serviceInfo
	// slices are grouped by Service, sorted by slice name (the order that
	// decides which copy of a duplicate endpoint is kept).
	slices map[types.NamespacedName][]*sliceInfo
	// sliceByName finds a slice by its own namespace/name.
	sliceByName map[types.NamespacedName]*sliceInfo
	// built holds what each Service of services built.
	built map[types.NamespacedName]*builtService
	// order are the Services with ports, sorted by their ports' name
	// prefix "namespace/name:" so that concatenating their (sorted) ports
	// gives State.Sort's order.
	order []orderKey
	// splitParents[t] are the Services whose split names t.
	splitParents map[types.NamespacedName]map[types.NamespacedName]bool
	// routeParents[t] are the parent Services of routes whose backendRefs
	// name t.
	routeParents map[types.NamespacedName]map[types.NamespacedName]bool
	// vips counts the Service ports per VIP over built, and dupVIPs the
	// VIPs counted more than once, to find duplicates without a map per
	// sync.
	vips    map[dataplane.VIP]int
	dupVIPs int
	// withProblems are the Services, slices and builds that have
	// problems, so that collecting them costs the problems, not the
	// objects.
	svcProblems, sliceProblems, builtProblems map[types.NamespacedName]bool
	// listeners and listenerProblems are the Gateway listener ports.
	listeners        []dataplane.ServicePort
	listenerProblems []Problem
	// indexProblems are the duplicate objects of the last Build (only
	// manifests can have them).
	indexProblems []Problem
	// dirty are Services to rebuild at the next Update (SetRoutes).
	dirty map[types.NamespacedName]bool
	// stale: every Service must be rebuilt (families changed); builtZone
	// is the Zone the built ports used.
	stale     bool
	builtZone string
	// assembled is the array of the last State returned when it holds no
	// listener and no duplicate VIP (nil otherwise): an Update whose
	// Services keep their ports' names and VIPs writes their new values
	// into it instead of copying every port (patch).
	assembled []dataplane.ServicePort
}

// builtService is what one Service built.
type builtService struct {
	// ports are sorted as State.Sort sorts, backends included.
	ports    []dataplane.ServicePort
	problems []Problem
}

type orderKey struct {
	prefix string // "namespace/name:"
	name   types.NamespacedName
	// built is built[name], so that assembling needs no map lookup (two
	// per Service were 40% of an Update at 10,000 Services).
	built *builtService
}

func newCache() builderCache {
	return builderCache{
		services:     map[types.NamespacedName]*serviceInfo{},
		slices:       map[types.NamespacedName][]*sliceInfo{},
		sliceByName:  map[types.NamespacedName]*sliceInfo{},
		built:        map[types.NamespacedName]*builtService{},
		splitParents: map[types.NamespacedName]map[types.NamespacedName]bool{},
		routeParents: map[types.NamespacedName]map[types.NamespacedName]bool{},
		vips:         map[dataplane.VIP]int{},
		dirty:        map[types.NamespacedName]bool{},

		svcProblems:   map[types.NamespacedName]bool{},
		sliceProblems: map[types.NamespacedName]bool{},
		builtProblems: map[types.NamespacedName]bool{},
	}
}

// ObjectChange is a Service or EndpointSlice as it is now: Object is a
// *corev1.Service or *discoveryv1.EndpointSlice, nil when it is gone.
type ObjectChange struct {
	Kind   string // KindService or KindEndpointSlice
	Name   types.NamespacedName
	Object any
}

// SetRoutes gives the Builder the routes of the next Builds. The parents
// of routes that changed are rebuilt at the next Update.
func (b *Builder) SetRoutes(r Routes) {
	if reflect.DeepEqual(r.Services, b.routes.Services) {
		b.routes = r
		return
	}
	for _, sr := range b.routes.Services {
		b.dirty[sr.Service] = true
	}
	for _, sr := range r.Services {
		b.dirty[sr.Service] = true
	}
	b.routes = r
	b.routeParents = map[types.NamespacedName]map[types.NamespacedName]bool{}
	for _, sr := range r.Services {
		for _, ref := range sr.Backends {
			if !ref.Invalid {
				addEdge(b.routeParents, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Service}, sr.Service)
			}
		}
	}
}

// Services returns the Services the Builder holds, in no order (as a
// lister gives them), for a RouteSource.
func (b *Builder) Services() []*corev1.Service {
	out := make([]*corev1.Service, 0, len(b.services))
	for _, si := range b.services {
		out = append(out, si.svc)
	}
	return out
}

// Service returns the Service the Builder holds by that name, or nil.
func (b *Builder) Service(name types.NamespacedName) *corev1.Service {
	if si := b.services[name]; si != nil {
		return si.svc
	}
	return nil
}

// Update folds changes into the Builder and returns the desired state, the
// problems (both as Build would return them for the objects the Builder
// now holds) and the Services whose ports differ from those the previous
// Build or Update returned. changed is nil when that is not known (every
// port may differ: the node's zone changed, or a VIP is used twice).
//
// The State may share its array with the one the previous Build or
// Update returned, whose ports it then overwrites: a caller keeps only
// the latest State (the agent does; every dataplane's record holds
// copies).
func (b *Builder) Update(changes []ObjectChange) (state dataplane.State, problems []Problem, changed map[dataplane.ServiceName]bool) {
	touched := b.dirty
	b.dirty = map[types.NamespacedName]bool{}
	dupBefore := b.anyDuplicateVIP()
	for _, c := range changes {
		switch c.Kind {
		case KindService:
			svc, _ := c.Object.(*corev1.Service)
			b.setService(c.Name, svc)
			touched[c.Name] = true
		case KindEndpointSlice:
			sl, _ := c.Object.(*discoveryv1.EndpointSlice)
			for _, n := range b.setSlice(c.Name, sl) {
				touched[n] = true
			}
		}
	}
	if b.stale || b.Zone != b.builtZone {
		b.rebuildAll()
		state, problems = b.assemble()
		return state, problems, nil
	}
	// The Services that read a touched one.
	todo := make(map[types.NamespacedName]bool, len(touched))
	for n := range touched {
		todo[n] = true
		for p := range b.splitParents[n] {
			todo[p] = true
		}
		for p := range b.routeParents[n] {
			todo[p] = true
		}
	}
	changed = make(map[dataplane.ServiceName]bool, len(todo))
	rebuilt := make([][2]*builtService, 0, len(todo))
	for n := range todo {
		old := b.built[n]
		nb := b.rebuild(n)
		if !samePorts(old, nb) {
			changed[dataplane.ServiceName{Namespace: n.Namespace, Name: n.Name}] = true
			rebuilt = append(rebuilt, [2]*builtService{old, nb})
		}
	}
	b.buildListeners()
	if b.patch(rebuilt) {
		state, problems = dataplane.State{Services: b.assembled}, b.problems()
	} else {
		state, problems = b.assemble()
	}
	if dupBefore || b.anyDuplicateVIP() {
		// A duplicate VIP drops the port of a Service nothing touched
		// (only manifests have them, and they have no tracker).
		changed = nil
	}
	return state, problems, changed
}

// setService replaces (svc nil: removes) one Service and its split edges.
func (b *Builder) setService(name types.NamespacedName, svc *corev1.Service) {
	old := b.services[name]
	if old != nil {
		for _, p := range old.split {
			removeEdge(b.splitParents, types.NamespacedName{Namespace: name.Namespace, Name: p.Service}, name)
		}
	}
	if svc == nil {
		delete(b.services, name)
		delete(b.svcProblems, name)
		return
	}
	si := newServiceInfo(svc, old)
	b.services[name] = si
	b.addSplitEdges(name, si)
	setFlag(b.svcProblems, name, len(si.problems) > 0)
}

func setFlag(m map[types.NamespacedName]bool, n types.NamespacedName, on bool) {
	if on {
		m[n] = true
	} else {
		delete(m, n)
	}
}

func (b *Builder) addSplitEdges(name types.NamespacedName, si *serviceInfo) {
	for _, p := range si.split {
		addEdge(b.splitParents, types.NamespacedName{Namespace: name.Namespace, Name: p.Service}, name)
	}
}

// setSlice replaces (sl nil: removes) one slice and returns the Services
// it belonged to before and after.
func (b *Builder) setSlice(name types.NamespacedName, sl *discoveryv1.EndpointSlice) []types.NamespacedName {
	var out []types.NamespacedName
	old := b.sliceByName[name]
	if old != nil {
		list := b.slices[old.service]
		if i := slices.Index(list, old); i >= 0 {
			list = slices.Delete(list, i, i+1)
		}
		if len(list) == 0 {
			delete(b.slices, old.service)
		} else {
			b.slices[old.service] = list
		}
		delete(b.sliceByName, name)
		delete(b.sliceProblems, name)
		out = append(out, old.service)
	}
	if sl == nil {
		return out
	}
	svcName := sl.Labels[discoveryv1.LabelServiceName]
	if svcName == "" {
		log.WithField(fieldSlice, sl.Namespace+"/"+sl.Name).Debug("EndpointSlice has no service-name label, ignored")
		return out
	}
	si := newSliceInfo(sl, svcName, old)
	b.sliceByName[name] = si
	setFlag(b.sliceProblems, name, len(si.problems) > 0)
	list := b.slices[si.service]
	i := sort.Search(len(list), func(i int) bool { return list[i].slice.Name >= sl.Name })
	b.slices[si.service] = slices.Insert(list, i, si)
	return append(out, si.service)
}

// reindex replaces every object (Build's input).
func (b *Builder) reindex(services []*corev1.Service, sls []*discoveryv1.EndpointSlice) {
	oldSvcs, oldSlices := b.services, b.sliceByName
	b.services = make(map[types.NamespacedName]*serviceInfo, len(services))
	b.slices = make(map[types.NamespacedName][]*sliceInfo, len(sls))
	b.sliceByName = make(map[types.NamespacedName]*sliceInfo, len(sls))
	b.splitParents = map[types.NamespacedName]map[types.NamespacedName]bool{}
	b.svcProblems = map[types.NamespacedName]bool{}
	b.sliceProblems = map[types.NamespacedName]bool{}
	b.indexProblems = nil
	bd := &build{b: b}
	for _, svc := range services {
		if svc == nil {
			continue
		}
		key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		if _, dup := b.services[key]; dup {
			// Only the manifest source can produce this (the same Service in
			// two files); the API server cannot.
			bd.problem(svc.Namespace, svc.Name, KindService, svc.Name, "", fmt.Errorf("duplicate Service, the first one is used"))
			continue
		}
		si := newServiceInfo(svc, oldSvcs[key])
		b.services[key] = si
		b.addSplitEdges(key, si)
		setFlag(b.svcProblems, key, len(si.problems) > 0)
	}
	for _, sl := range sls {
		if sl == nil {
			continue
		}
		svcName := sl.Labels[discoveryv1.LabelServiceName]
		if svcName == "" {
			log.WithField(fieldSlice, sl.Namespace+"/"+sl.Name).Debug("EndpointSlice has no service-name label, ignored")
			continue
		}
		own := types.NamespacedName{Namespace: sl.Namespace, Name: sl.Name}
		if b.sliceByName[own] != nil {
			bd.problem(sl.Namespace, svcName, KindEndpointSlice, sl.Name, "", fmt.Errorf("duplicate EndpointSlice, the first one is used"))
			continue
		}
		si := newSliceInfo(sl, svcName, oldSlices[own])
		b.sliceByName[own] = si
		b.slices[si.service] = append(b.slices[si.service], si)
		setFlag(b.sliceProblems, own, len(si.problems) > 0)
	}
	for _, list := range b.slices {
		sort.Slice(list, func(i, j int) bool { return list[i].slice.Name < list[j].slice.Name })
	}
	b.indexProblems = bd.problems
	b.dirty = map[types.NamespacedName]bool{}
}

// rebuildAll rebuilds every Service from the objects held: the full
// rebuild, and the repair path.
func (b *Builder) rebuildAll() {
	// The last State's array holds the old builds' ports and Backends:
	// let them go before building everything again, or both are live at
	// the peak of a full sync.
	b.assembled = nil
	b.built = make(map[types.NamespacedName]*builtService, len(b.services))
	b.builtProblems = map[types.NamespacedName]bool{}
	b.order = make([]orderKey, 0, len(b.services))
	b.vips = make(map[dataplane.VIP]int, len(b.services))
	b.dupVIPs = 0
	for n := range b.services {
		if nb := b.build1(n); len(nb.ports) > 0 {
			b.order = append(b.order, orderKey{prefix: n.Namespace + "/" + n.Name + ":", name: n, built: nb})
		}
	}
	sort.Slice(b.order, func(i, j int) bool { return b.order[i].prefix < b.order[j].prefix })
	b.buildListeners()
	b.stale, b.builtZone = false, b.Zone
}

// rebuild builds Service n again (or forgets it when it is gone), keeping
// order up to date, and returns what it built (nil: gone).
func (b *Builder) rebuild(n types.NamespacedName) *builtService {
	old := b.built[n]
	if old != nil {
		for i := range old.ports {
			b.countVIP(old.ports[i].VIP, -1)
		}
		delete(b.built, n)
		delete(b.builtProblems, n)
	}
	var nb *builtService
	if b.services[n] != nil {
		nb = b.build1(n)
	}
	if had, has := old != nil && len(old.ports) > 0, nb != nil && len(nb.ports) > 0; had || has {
		b.setOrder(n, nb, has)
	}
	return nb
}

// build1 builds Service n (which the Builder holds) into built.
func (b *Builder) build1(n types.NamespacedName) *builtService {
	bd := &build{b: b}
	st := dataplane.State{Services: bd.servicePorts(b.services[n])}
	st.Sort()
	nb := &builtService{ports: st.Services, problems: bd.problems}
	for i := range nb.ports {
		b.countVIP(nb.ports[i].VIP, 1)
	}
	b.built[n] = nb
	setFlag(b.builtProblems, n, len(nb.problems) > 0)
	return nb
}

func (b *Builder) countVIP(v dataplane.VIP, d int) {
	before := b.vips[v]
	c := before + d
	if c > 0 {
		b.vips[v] = c
	} else {
		delete(b.vips, v)
	}
	switch {
	case before <= 1 && c > 1:
		b.dupVIPs++
	case before > 1 && c <= 1:
		b.dupVIPs--
	}
}

// setOrder inserts, updates or removes n in order (binary search: the
// memmove of 10,000 keys costs far less than sorting them).
func (b *Builder) setOrder(n types.NamespacedName, bs *builtService, present bool) {
	k := orderKey{prefix: n.Namespace + "/" + n.Name + ":", name: n, built: bs}
	i := sort.Search(len(b.order), func(i int) bool { return b.order[i].prefix >= k.prefix })
	found := i < len(b.order) && b.order[i].prefix == k.prefix
	switch {
	case present && found:
		b.order[i] = k
	case present:
		b.order = slices.Insert(b.order, i, k)
	case found:
		b.order = slices.Delete(b.order, i, i+1)
	}
}

// buildListeners builds the Gateway listener ports, sorted (stable: two
// listeners with the same name and VIP keep the routes' order).
func (b *Builder) buildListeners() {
	bd := &build{b: b}
	st := dataplane.State{Services: bd.listenerPorts()}
	st.Sort()
	b.listeners, b.listenerProblems = st.Services, bd.problems
}

// patch writes the ports of the rebuilt Services ({old, new} builds) into
// the last assembled array, where they take the places of the old ones,
// and reports whether it could: each new build has the same port names
// and VIPs as the old one (so the same places), and the State has no
// listener and no duplicate VIP. assemble copies every port, 2.4 MB per
// endpoint change at 10,000 Services x 10 (BenchmarkEndpointChange10kx10),
// which made the change's CPU grow with the cluster.
func (b *Builder) patch(rebuilt [][2]*builtService) bool {
	if b.assembled == nil || len(b.listeners) > 0 || b.anyDuplicateVIP() {
		return false
	}
	at := make([]int, len(rebuilt))
	for k, r := range rebuilt {
		old, nb := r[0], r[1]
		if old == nil || nb == nil || len(old.ports) == 0 || len(old.ports) != len(nb.ports) {
			return false
		}
		for i := range old.ports {
			if old.ports[i].Name != nb.ports[i].Name || old.ports[i].VIP != nb.ports[i].VIP {
				return false
			}
		}
		// The old ports are in the array, sorted: the first is where
		// the first name of that Service starts.
		first := old.ports[0].Name.String()
		i := sort.Search(len(b.assembled), func(i int) bool { return b.assembled[i].Name.String() >= first })
		if i+len(old.ports) > len(b.assembled) {
			return false
		}
		for j := range old.ports {
			if a := &b.assembled[i+j]; a.Name != old.ports[j].Name || a.VIP != old.ports[j].VIP {
				return false
			}
		}
		at[k] = i
	}
	for k, r := range rebuilt {
		copy(b.assembled[at[k]:], r[1].ports)
	}
	return true
}

// assemble returns the State of what is built, sorted, and the problems.
func (b *Builder) assemble() (dataplane.State, []Problem) {
	total := len(b.listeners)
	for _, k := range b.order {
		total += len(k.built.ports)
	}
	out := make([]dataplane.ServicePort, 0, total)
	li := 0
	for _, k := range b.order {
		if len(b.listeners) == li {
			out = append(out, k.built.ports...)
			continue
		}
		for _, sp := range k.built.ports {
			// A listener sorts before this port only when strictly less:
			// a full sort is stable, with Services first.
			for li < len(b.listeners) && portLess(&b.listeners[li], &sp) {
				out = append(out, b.listeners[li])
				li++
			}
			out = append(out, sp)
		}
	}
	out = append(out, b.listeners[li:]...)
	b.assembled = nil
	if len(b.listeners) == 0 && !b.anyDuplicateVIP() {
		b.assembled = out
	}
	problems := b.problems()
	if b.anyDuplicateVIP() {
		var more []Problem
		out, more = dropDuplicateVIPs(out)
		problems = append(problems, more...)
		sortProblems(problems)
	}
	return dataplane.State{Services: out}, problems
}

// problems returns the problems of what is built, sorted (without those
// of duplicate VIPs).
func (b *Builder) problems() []Problem {
	var problems []Problem
	problems = append(problems, b.indexProblems...)
	for n := range b.svcProblems {
		problems = append(problems, b.services[n].problems...)
	}
	for n := range b.sliceProblems {
		problems = append(problems, b.sliceByName[n].problems...)
	}
	for n := range b.builtProblems {
		problems = append(problems, b.built[n].problems...)
	}
	problems = append(problems, b.listenerProblems...)
	sortProblems(problems)
	return problems
}

func (b *Builder) anyDuplicateVIP() bool {
	if b.dupVIPs > 0 {
		return true
	}
	if len(b.listeners) == 0 {
		return false
	}
	seen := make(map[dataplane.VIP]bool, len(b.listeners))
	for i := range b.listeners {
		v := b.listeners[i].VIP
		if seen[v] || b.vips[v] > 0 {
			return true
		}
		seen[v] = true
	}
	return false
}

// portLess is State.Sort's order.
func portLess(a, b *dataplane.ServicePort) bool {
	if a.Name != b.Name {
		return a.Name.String() < b.Name.String()
	}
	return a.VIP.String() < b.VIP.String()
}

// samePorts reports whether two builds of a Service give the same ports.
func samePorts(a, b *builtService) bool {
	if a == nil || b == nil {
		return (a == nil || len(a.ports) == 0) && (b == nil || len(b.ports) == 0)
	}
	return slices.EqualFunc(a.ports, b.ports, func(x, y dataplane.ServicePort) bool { return x.Equal(&y) })
}

// dropDuplicateVIPs keeps the first Service port (in name order) of each VIP.
// Only manifests can produce duplicates; a dataplane cannot program them.
func dropDuplicateVIPs(sps []dataplane.ServicePort) ([]dataplane.ServicePort, []Problem) {
	bd := &build{}
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
	return out, bd.problems
}

func addEdge(m map[types.NamespacedName]map[types.NamespacedName]bool, to, from types.NamespacedName) {
	s := m[to]
	if s == nil {
		s = map[types.NamespacedName]bool{}
		m[to] = s
	}
	s[from] = true
}

func removeEdge(m map[types.NamespacedName]map[types.NamespacedName]bool, to, from types.NamespacedName) {
	if s := m[to]; s != nil {
		delete(s, from)
		if len(s) == 0 {
			delete(m, to)
		}
	}
}
