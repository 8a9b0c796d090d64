package nftables

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The per Service port objects, by name prefix. Names are a stable hash of
// the Service port (and endpoint) plus a readable suffix, as kube-proxy's.
const (
	svcPrefix = "svc-" // cluster-wide split (the clusterIP, Cluster policies)
	svlPrefix = "svl-" // split over this node's endpoints (Local policies)
	extPrefix = "ext-" // external entry points: masquerade, then svc or svl
	fwPrefix  = "fw-"  // loadBalancerSourceRanges check before ext
	epPrefix  = "ep-"  // one endpoint of a ClientIP affinity port: hairpin mark, affinity, DNAT
	// Weight maps: shared ones "dn-NNNN"/"wv-NNNN" (weightmaps.go); the
	// names of the per-port maps of earlier versions, "dc-"/"dl-" (DNAT)
	// and "wc-"/"wl-" (verdict), which a full sync deletes as unused. Sets
	// of affinity: "af-" + the hash of the endpoint chain.
	wPrefix    = "w"
	dnatPrefix = "d"
	// countPrefix: "kc-"/"kl-", the DNAT maps of CountConnections, with
	// a counter on each element (counts.go); other names than "dc-"/"dl-"
	// since a map cannot gain a counter in place. legacyCountPrefix:
	// "nc-"/"nl-", the same maps keyed "numgen . meta l4proto" until
	// 2026-12-07 (a key type cannot change in place either, weightmaps.go).
	countPrefix       = "k"
	legacyCountPrefix = "n"
	affPrefix         = "af-"
)

// Comment suffixes of the shared elements naming the external entry points.
const (
	kindNodePort     = " node port"
	kindExternalIP   = " external IP"
	kindLoadBalancer = " loadbalancer IP"
)

// portObjects is everything one Service port owns in the table, rendered.
// A partial sync compares the old and new portObjects of the Service ports
// that changed and writes only the difference.
type portObjects struct {
	src     *dataplane.ServicePort
	comment string
	// chains: name -> rules, and the names in write order (endpoint chains
	// first, so the maps and rules that jump to them find them).
	chains map[string][]rule
	order  []string
	// maps are the weight maps; sets the affinity sets (timeout seconds).
	maps map[string]*weightMap
	sets map[string]int
	// elems are the elements of the shared maps (service-ips, ...).
	elems []elem
	// hairpin are the elements this port needs in the shared hairpin set
	// (hairpin.go): its endpoints, unless it has endpoint chains.
	hairpin []hairpinKey
}

func (o *portObjects) addChain(name string, rules ...rule) {
	if _, ok := o.chains[name]; !ok {
		o.order = append(o.order, name)
	}
	o.chains[name] = append(o.chains[name], rules...)
}

// renderPort renders one Service port. family and the masquerade settings
// come from the Proxier; nothing here reads the kernel.
func (p *Proxier) renderPort(sp *dataplane.ServicePort) *portObjects {
	name := sp.Name.String()
	proto := sp.VIP.Protocol.Lower()
	pnum := protoNumbers[proto]
	o := &portObjects{
		src:     sp.Clone(),
		comment: name,
		chains:  map[string][]rule{},
		maps:    map[string]*weightMap{},
		sets:    map[string]int{},
	}
	id := name + "|" + sp.VIP.String()
	readable := sp.Name.Namespace + "/" + sp.Name.Name + "/" + proto + "/" + sp.Name.Port
	svc := chainName(svcPrefix, id, readable)
	svl := chainName(svlPrefix, id, readable)
	ext := chainName(extPrefix, id, readable)
	fw := chainName(fwPrefix, id, readable)

	// The entry points: the clusterIP, then the external ones.
	type entry struct {
		mapName string
		key     svcKey
		lb      bool
		kind    string
	}
	internal := entry{mapServiceIPs, svcKey{sp.VIP.IP, pnum, sp.VIP.Port}, false, ""}
	var external []entry
	if sp.NodePort != 0 {
		external = append(external, entry{mapServiceNodePorts, svcKey{proto: pnum, port: sp.NodePort}, false, kindNodePort})
	}
	for _, ip := range sp.ExternalIPs {
		external = append(external, entry{mapServiceIPs, svcKey{ip, pnum, sp.VIP.Port}, false, kindExternalIP})
	}
	for _, ip := range sp.LoadBalancerIPs {
		external = append(external, entry{mapServiceIPs, svcKey{ip, pnum, sp.VIP.Port}, true, kindLoadBalancer})
	}
	// noEndpoints is the filter map of an entry: refused or dropped before
	// any endpoint is tried.
	noEndpoints := func(e entry, v verdict) {
		m := mapNoEndpointServices
		if e.mapName == mapServiceNodePorts {
			m = mapNoEndpointNodePorts
		}
		o.elems = append(o.elems, elem{m, e.key, v, e.kind})
	}

	active := sp.Active()
	if len(active) == 0 {
		// Refuse at once instead of letting the client time out.
		noEndpoints(internal, goTo(chainReject))
		for _, e := range external {
			noEndpoints(e, goTo(chainReject))
		}
		return o
	}
	cluster := sp.ClusterBackends()
	if len(cluster) == 0 {
		cluster = active // the controller never leaves topology with nothing
	}
	local := sp.LocalBackends()
	if sp.RejectWeight > 0 {
		// The reject share returns from the split without DNAT (verdict
		// "return" in the weight map) and is refused by the filter map,
		// which sees only what nothing DNATed. Entry points that drop
		// what is not DNATed drop it instead.
		if !sp.InternalLocal || len(local) > 0 {
			noEndpoints(internal, goTo(chainRejectShare))
		}
		for _, e := range external {
			if (!sp.ExternalLocal || len(local) > 0) && !(e.lb && len(sp.SourceRanges) > 0) {
				noEndpoints(e, goTo(chainRejectShare))
			}
		}
	}
	usesSVC := !sp.InternalLocal || len(external) > 0
	usesSVL := (sp.InternalLocal || (len(external) > 0 && sp.ExternalLocal)) && len(local) > 0

	switch {
	case !sp.InternalLocal:
		o.elems = append(o.elems, elem{mapServiceIPs, internal.key, goTo(svc), ""})
	case len(local) > 0:
		o.elems = append(o.elems, elem{mapServiceIPs, internal.key, goTo(svl), ""})
	default:
		// internalTrafficPolicy Local without a local endpoint: drop, as
		// kube-proxy does.
		noEndpoints(internal, vDrop)
	}

	if len(external) > 0 {
		hasFW := len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
		for _, e := range external {
			target := ext
			if e.lb && hasFW {
				target = fw
			}
			o.elems = append(o.elems, elem{e.mapName, e.key, goTo(target), e.kind})
			switch {
			case sp.ExternalLocal && len(local) == 0:
				// Only what the ext chain sends on (pods, the node) is
				// DNATed; the rest reaches the filter still aimed here.
				noEndpoints(e, vDrop)
			case e.lb && hasFW:
				noEndpoints(e, vDrop) // sources not allowed by fw
			}
		}
		if hasFW {
			o.addChain(fw, r(srcRanges(slices.Clone(sp.SourceRanges)), goTo(ext)))
		}
		if !sp.ExternalLocal {
			// Cluster policy: the endpoint may be on another node, so the
			// reply must come back through this one.
			o.addChain(ext, r(jump(chainMarkMasq)), r(goTo(svc)))
		} else {
			// Local policy: pods and the node itself still reach every
			// endpoint (the node masqueraded); others keep their source
			// address and reach only this node's endpoints.
			var rules []rule
			if p.hasCIDRs() {
				rules = append(rules, r(inSet{field: saddr, set: setClusterCIDRs}, goTo(svc)))
			}
			rules = append(rules, r(fibLocal, jump(chainMarkMasq)), r(fibLocal, goTo(svc)))
			if len(local) > 0 {
				rules = append(rules, r(goTo(svl)))
			}
			o.addChain(ext, rules...)
		}
	}

	var used []dataplane.Backend
	if usesSVC {
		used = append(used, cluster...)
	}
	if usesSVL {
		used = append(used, local...)
	}
	// Hairpin: a pod reaching itself through the VIP must see the node as
	// the source, or its reply would never be un-DNATed. Without affinity
	// the shared hairpin set says it; with affinity each endpoint chain
	// marks it, as before.
	affinity := sp.AffinitySeconds > 0
	eps := map[netip.AddrPort]string{}
	for _, b := range used {
		if _, ok := eps[b.Addr()]; ok {
			continue
		}
		addr := b.Addr().String()
		if !affinity {
			eps[b.Addr()] = ""
			o.hairpin = append(o.hairpin, newHairpinKey(b.IP, pnum, b.Port))
			continue
		}
		// Endpoint chains first: the split rules and maps refer to them.
		ep := chainName(epPrefix, id+"|"+addr, sp.Name.Namespace+"/"+sp.Name.Name+"/"+sp.Name.Port+"__"+addr)
		eps[b.Addr()] = ep
		aff := affinitySet(ep)
		o.sets[aff] = sp.AffinitySeconds
		o.addChain(ep,
			r(addrIs{saddr, b.IP}, jump(chainMarkMasq)),
			r(updateSaddr(aff)),
			r(l4proto(pnum), dnatTo(b.Addr())))
	}

	split := func(chain string, bs []dataplane.Backend, masq bool) {
		var rules []rule
		if masq {
			vip, vport := addrIs{daddr, sp.VIP.IP}, dport{pnum, sp.VIP.Port}
			switch {
			case p.cfg.MasqueradeAll:
				rules = append(rules, r(vip, vport, jump(chainMarkMasq)))
			case p.hasCIDRs():
				// Off-cluster clients of the clusterIP are masqueraded so
				// the reply comes back through this node.
				rules = append(rules, r(vip, vport, inSet{saddr, true, setClusterCIDRs}, jump(chainMarkMasq)))
			}
		}
		if affinity {
			for _, b := range bs {
				ep := eps[b.Addr()]
				rules = append(rules, r(inSet{field: saddr, set: affinitySet(ep)}, goTo(ep)))
			}
		}
		weights := make([]float64, len(bs), len(bs)+1)
		for i, b := range bs {
			weights[i] = b.Weight
		}
		if sp.RejectShare(bs) > 0 {
			weights = append(weights, sp.RejectWeight) // the last range
		}
		mod, ranges := Ranges(weights)
		wm := &weightMap{dnat: !affinity, proto: pnum}
		// A shared weight map, the port's draws at its offset there
		// (weightmaps.go); a counted map is the port's own.
		mname := shardName(chain, !affinity, pnum)
		var off uint32
		if !affinity && p.cfg.CountConnections {
			mname = countedMapName(chain)
		} else {
			off = p.slots.place(chain, mname)
		}
		for i, rg := range ranges {
			if rg[1] < rg[0] {
				continue // too small a weight for one bucket
			}
			e := wmElem{lo: off + uint32(rg[0]), hi: off + uint32(rg[1])}
			switch {
			case i == len(bs) && !affinity:
				// The reject share is the range without an element: the
				// lookup misses, the DNAT rule does not match and the
				// chain ends; the filter map refuses what nothing DNATed.
				continue
			case i == len(bs):
				e.to = vReturn
			case !affinity:
				e.dnat = bs[i].Addr()
			default:
				e.to = goTo(eps[bs[i].Addr()])
			}
			wm.elems = append(wm.elems, e)
		}
		o.maps[mname] = wm
		// The key is the draw alone: the kernel keeps the map in an
		// rbtree, whose commit costs what it changes (weightmaps.go).
		if affinity {
			rules = append(rules, r(numgenVmap{uint32(mod), off, mname}))
		} else {
			// One rule DNATs through the map: no chain per endpoint (at
			// 10,000 Services x 10 endpoints 10,005 chains instead of
			// 110,012; see docs/dataplanes.md).
			rules = append(rules, r(l4proto(pnum), numgenDNAT{uint32(mod), off, mname}))
		}
		o.addChain(chain, rules...)
	}
	if usesSVC {
		split(svc, cluster, true)
	}
	if usesSVL {
		split(svl, local, false)
	}
	// Write order: endpoint chains, then the split chains, then ext and fw.
	slices.SortStableFunc(o.order, func(a, b string) int { return rank(a) - rank(b) })
	return o
}

func rank(chain string) int {
	switch {
	case strings.HasPrefix(chain, epPrefix):
		return 0
	case strings.HasPrefix(chain, svcPrefix), strings.HasPrefix(chain, svlPrefix):
		return 1
	case strings.HasPrefix(chain, extPrefix):
		return 2
	}
	return 3
}

// weightMapName is the weight map of a split chain: "wc-HASH" for svc-,
// "wl-HASH" for svl- (the hash alone keeps the name short).
func weightMapName(chain string) string {
	kind := "c"
	if strings.HasPrefix(chain, svlPrefix) {
		kind = "l"
	}
	h, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(chain, svcPrefix), svlPrefix), "-")
	return wPrefix + kind + "-" + h
}

// countedMapName is the counted DNAT map of a split chain: "kc-HASH" for
// svc-, "kl-HASH" for svl-.
func countedMapName(chain string) string {
	return countPrefix + strings.TrimPrefix(weightMapName(chain), wPrefix)
}

// countedMap reports whether map m counts its elements' packets.
func countedMap(m string) bool {
	return strings.HasPrefix(m, countPrefix+"c-") || strings.HasPrefix(m, countPrefix+"l-")
}

// affinitySet is the set of clients recently sent to endpoint chain ep.
func affinitySet(ep string) string {
	h, _, _ := strings.Cut(strings.TrimPrefix(ep, epPrefix), "-")
	return affPrefix + h
}

// hasCIDRs reports whether this family has cluster CIDRs.
func (p *Proxier) hasCIDRs() bool { return len(p.familyCIDRs()) > 0 }

func (p *Proxier) familyCIDRs() []string {
	var out []string
	for _, c := range p.cfg.ClusterCIDRs {
		if (p.cfg.Family == 6) == c.Addr().Is6() {
			out = append(out, c.Masked().String())
		}
	}
	return out
}
