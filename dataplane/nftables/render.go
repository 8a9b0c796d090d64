package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
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
	// Weight maps: "dc-"/"dl-" + the hash of the svc/svl chain, DNAT maps
	// (numgen range -> endpoint address . port); "wc-"/"wl-" for ports with
	// ClientIP affinity, verdict maps to their endpoint chains. Sets of
	// affinity: "af-" + the hash of the endpoint chain.
	wPrefix    = "w"
	dnatPrefix = "d"
	// countPrefix: "nc-"/"nl-", the DNAT maps of CountConnections, with
	// a counter on each element (counts.go); other names than "dc-"/"dl-"
	// since a map cannot gain a counter in place.
	countPrefix = "n"
	affPrefix   = "af-"
)

// Comment suffixes of the shared elements naming the external entry points.
const (
	kindNodePort     = " node port"
	kindExternalIP   = " external IP"
	kindLoadBalancer = " loadbalancer IP"
)

// elem is one element of a shared map, owned by one Service port.
type elem struct {
	m     string   // map name
	key   []string // key fields
	value string   // verdict
	// kind is the comment suffix naming the entry point ("" for the
	// clusterIP); explain reads it back.
	kind string
}

func (e elem) id() string { return e.m + " " + strings.Join(e.key, " . ") }

// weightMap is a Service port's map from numgen ranges to endpoints: a
// DNAT map (values "198.19.1.2 . 8080") or, with ClientIP affinity, a
// verdict map to endpoint chains ("goto ep-...").
type weightMap struct {
	// data is the type of the values: "verdict", or "ip daddr . tcp dport"
	// (ip6 for IPv6, the port's protocol).
	data  string
	elems [][2]string // "lo-hi", "198.19.1.2 . 8080" or "goto ep-..."
}

// portObjects is everything one Service port owns in the table, rendered.
// A partial sync compares the old and new portObjects of the Service ports
// that changed and writes only the difference.
type portObjects struct {
	src     *dataplane.ServicePort
	comment string
	// chains: name -> rules, and the names in write order (endpoint chains
	// first, so the maps and rules that jump to them find them).
	chains map[string][]string
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

func (o *portObjects) addChain(name string, rules ...string) {
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
	port := strconv.Itoa(int(sp.VIP.Port))
	o := &portObjects{
		src:     clonePort(sp),
		comment: name,
		chains:  map[string][]string{},
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
		key     []string
		lb      bool
		kind    string
	}
	internal := entry{mapServiceIPs, []string{sp.VIP.IP.String(), proto, port}, false, ""}
	var external []entry
	if sp.NodePort != 0 {
		external = append(external, entry{mapServiceNodePorts, []string{proto, strconv.Itoa(int(sp.NodePort))}, false, kindNodePort})
	}
	for _, ip := range sp.ExternalIPs {
		external = append(external, entry{mapServiceIPs, []string{ip.String(), proto, port}, false, kindExternalIP})
	}
	for _, ip := range sp.LoadBalancerIPs {
		external = append(external, entry{mapServiceIPs, []string{ip.String(), proto, port}, true, kindLoadBalancer})
	}
	// noEndpoints is the filter map of an entry: refused or dropped before
	// any endpoint is tried.
	noEndpoints := func(e entry, verdict string) {
		m := mapNoEndpointServices
		if e.mapName == mapServiceNodePorts {
			m = mapNoEndpointNodePorts
		}
		o.elems = append(o.elems, elem{m, e.key, verdict, e.kind})
	}

	active := sp.Active()
	if len(active) == 0 {
		// Refuse at once instead of letting the client time out.
		noEndpoints(internal, "goto "+chainReject)
		for _, e := range external {
			noEndpoints(e, "goto "+chainReject)
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
			noEndpoints(internal, "goto "+chainRejectShare)
		}
		for _, e := range external {
			if (!sp.ExternalLocal || len(local) > 0) && !(e.lb && len(sp.SourceRanges) > 0) {
				noEndpoints(e, "goto "+chainRejectShare)
			}
		}
	}
	usesSVC := !sp.InternalLocal || len(external) > 0
	usesSVL := (sp.InternalLocal || (len(external) > 0 && sp.ExternalLocal)) && len(local) > 0

	switch {
	case !sp.InternalLocal:
		o.elems = append(o.elems, elem{mapServiceIPs, internal.key, "goto " + svc, ""})
	case len(local) > 0:
		o.elems = append(o.elems, elem{mapServiceIPs, internal.key, "goto " + svl, ""})
	default:
		// internalTrafficPolicy Local without a local endpoint: drop, as
		// kube-proxy does.
		noEndpoints(internal, "drop")
	}

	if len(external) > 0 {
		hasFW := len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0
		for _, e := range external {
			target := ext
			if e.lb && hasFW {
				target = fw
			}
			o.elems = append(o.elems, elem{e.mapName, e.key, "goto " + target, e.kind})
			switch {
			case sp.ExternalLocal && len(local) == 0:
				// Only what the ext chain sends on (pods, the node) is
				// DNATed; the rest reaches the filter still aimed here.
				noEndpoints(e, "drop")
			case e.lb && hasFW:
				noEndpoints(e, "drop") // sources not allowed by fw
			}
		}
		if hasFW {
			var rs []string
			for _, r := range sp.SourceRanges {
				rs = append(rs, r.String())
			}
			o.addChain(fw, p.f.ip+" saddr { "+strings.Join(rs, ", ")+" } goto "+ext)
		}
		if !sp.ExternalLocal {
			// Cluster policy: the endpoint may be on another node, so the
			// reply must come back through this one.
			o.addChain(ext, "jump "+chainMarkMasq, "goto "+svc)
		} else {
			// Local policy: pods and the node itself still reach every
			// endpoint (the node masqueraded); others keep their source
			// address and reach only this node's endpoints.
			var rules []string
			if p.hasCIDRs() {
				rules = append(rules, p.f.ip+" saddr @"+setClusterCIDRs+" goto "+svc)
			}
			rules = append(rules, "fib saddr type local jump "+chainMarkMasq, "fib saddr type local goto "+svc)
			if len(local) > 0 {
				rules = append(rules, "goto "+svl)
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
			o.hairpin = append(o.hairpin, newHairpinKey(b.IP, protoNumbers[proto], b.Port))
			continue
		}
		// Endpoint chains first: the split rules and maps refer to them.
		ep := chainName(epPrefix, id+"|"+addr, sp.Name.Namespace+"/"+sp.Name.Name+"/"+sp.Name.Port+"__"+addr)
		eps[b.Addr()] = ep
		aff := affinitySet(ep)
		o.sets[aff] = sp.AffinitySeconds
		o.addChain(ep,
			p.f.ip+" saddr "+b.IP.String()+" jump "+chainMarkMasq,
			"update @"+aff+" { "+p.f.ip+" saddr }",
			"meta l4proto "+proto+" dnat to "+addr)
	}

	split := func(chain string, bs []dataplane.Backend, masq bool) {
		var rules []string
		if masq {
			vip := p.f.ip + " daddr " + sp.VIP.IP.String() + " " + proto + " dport " + port
			switch {
			case p.cfg.MasqueradeAll:
				rules = append(rules, vip+" jump "+chainMarkMasq)
			case p.hasCIDRs():
				// Off-cluster clients of the clusterIP are masqueraded so
				// the reply comes back through this node.
				rules = append(rules, vip+" "+p.f.ip+" saddr != @"+setClusterCIDRs+" jump "+chainMarkMasq)
			}
		}
		if affinity {
			for _, b := range bs {
				ep := eps[b.Addr()]
				rules = append(rules, p.f.ip+" saddr @"+affinitySet(ep)+" goto "+ep)
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
		wm := &weightMap{data: "verdict"}
		mname := weightMapName(chain)
		if !affinity {
			wm.data = p.f.ip + " daddr . " + proto + " dport"
			mname = dnatMapName(chain)
			if p.cfg.CountConnections {
				mname = countedMapName(chain)
			}
		}
		for i, r := range ranges {
			if r[1] < r[0] {
				continue // too small a weight for one bucket
			}
			var value string
			switch {
			case i == len(bs) && !affinity:
				// The reject share is the range without an element: the
				// lookup misses, the DNAT rule does not match and the
				// chain ends; the filter map refuses what nothing DNATed.
				continue
			case i == len(bs):
				value = "return"
			case !affinity:
				value = bs[i].IP.String() + " . " + strconv.Itoa(int(bs[i].Port))
			default:
				value = "goto " + eps[bs[i].Addr()]
			}
			wm.elems = append(wm.elems, [2]string{fmt.Sprintf("%d-%d", r[0], r[1]), value})
		}
		o.maps[mname] = wm
		// "numgen . meta l4proto": the concatenation keeps nft 1.0.6 from
		// reading every interval map of the table before each element
		// change (see the package comment).
		if affinity {
			rules = append(rules, fmt.Sprintf("numgen random mod %d . meta l4proto vmap @%s", mod, mname))
		} else {
			// One rule DNATs through the map: no chain per endpoint (at
			// 10,000 Services x 10 endpoints 10,005 chains instead of
			// 110,012; see docs/dataplanes.md).
			rules = append(rules, fmt.Sprintf("meta l4proto %s dnat %s to numgen random mod %d . meta l4proto map @%s", proto, p.f.ip, mod, mname))
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

// dnatMapName is the DNAT map of a split chain without affinity: "dc-HASH"
// for svc-, "dl-HASH" for svl-. Other names than the verdict maps' so that
// a table of an older steelyard (verdict maps wc- for every port) is
// upgraded in place: a map cannot change its type under the same name.
func dnatMapName(chain string) string {
	return dnatPrefix + strings.TrimPrefix(weightMapName(chain), wPrefix)
}

// countedMapName is the counted DNAT map of a split chain: "nc-HASH" for
// svc-, "nl-HASH" for svl-.
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

func clonePort(sp *dataplane.ServicePort) *dataplane.ServicePort {
	c := *sp
	c.Backends = slices.Clone(sp.Backends)
	c.ExternalIPs = slices.Clone(sp.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
	c.SourceRanges = slices.Clone(sp.SourceRanges)
	return &c
}
