package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Explain implements dataplane.Dataplane: it reads the live table into the
// model's types (kernel_read.go), follows each entry point of the shared
// maps through the chains and weight maps, and computes each backend's
// share of new connections from the numgen ranges. Nothing here reads
// rule text: chains are statements, elements typed values.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	read := p.readLive
	if read == nil {
		read = p.modelTable
	}
	t, err := read()
	if err != nil || t == nil {
		return nil, err
	}
	var nodeAddrs []string
	for _, a := range t.nodeIPs {
		nodeAddrs = append(nodeAddrs, a.String())
	}
	drops := map[elemKey]verdict{} // entry -> verdict in the filter maps
	for _, m := range []string{mapNoEndpointServices, mapNoEndpointNodePorts} {
		for _, e := range t.shared[m] {
			drops[keyOf(e.e)] = e.e.to
		}
	}
	// The entry points first, then their views: each view only reads t,
	// so two goroutines follow half the views each. Following took 0.12
	// CPU-s per explain at 10,000 Services (a profile of five), which two
	// idle cores do in half the wall time.
	type entry struct {
		m string
		e sharedElem
	}
	var entries []entry
	seen := map[elemKey]bool{}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts} {
		for _, e := range t.shared[m] {
			k := keyOf(e.e)
			if seen[k] {
				continue // a filter element of an entry already followed
			}
			seen[k] = true
			entries = append(entries, entry{m, e})
		}
	}
	views := make([]dataplane.ServiceView, len(entries))
	view := func(i int) {
		m, e := entries[i].m, entries[i].e
		v := p.viewOf(e)
		if v.Entry == dataplane.EntryNodePort {
			v.NodeAddresses = nodeAddrs
		}
		filter, filtered := drops[keyOf(e.e)]
		switch {
		case m == mapNoEndpointServices || m == mapNoEndpointNodePorts:
			// Only refused or dropped.
			if filter.chain == chainReject || filter.chain == chainRejectShare {
				v.Reject, v.Policy = true, ""
			} else {
				v.Drop, v.Policy = true, dataplane.PolicyLocal
			}
		case e.e.to.kind != goTo("").kind || e.e.to.chain == "":
			v.Problems = append(v.Problems, fmt.Sprintf("unexpected map value %q", e.e.to.text(p.f)))
		default:
			t.follow(e.e.to.chain, &v)
			if len(v.Backends) == 0 && filtered && filter == vDrop {
				v.Drop = true
			}
			if v.RejectShare > 0 && !filtered {
				v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections leave the split without DNAT and are not refused", v.RejectShare))
			}
		}
		views[i] = v
	}
	var wg sync.WaitGroup
	half := len(entries) / 2
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := half; i < len(entries); i++ {
			view(i)
		}
	}()
	for i := 0; i < half; i++ {
		view(i)
	}
	wg.Wait()
	// Masquerading happens in fixed chains every marked connection passes:
	// without them hairpin and off-cluster connections keep their source,
	// which no share shows, so every forwarded view carries the problem.
	if problem := t.masqueradeProblem(); problem != "" {
		for i := range views {
			if len(views[i].Backends) > 0 {
				views[i].Problems = append(views[i].Problems, problem)
			}
		}
	}
	dataplane.SortViews(views)
	return views, nil
}

// elemKey is an entry point: a shared map's key, whichever map holds it
// (a node port's key has no address).
type elemKey struct {
	node bool
	key  svcKey
}

func keyOf(e elem) elemKey {
	return elemKey{e.m == mapServiceNodePorts || e.m == mapNoEndpointNodePorts, e.key}
}

// masqueradeProblem reports what is missing for marked connections to be
// masqueraded: nat postrouting jumping to the masquerading chain, which
// masquerades and marks what the hairpin set matches, and the chain that
// sets the mark.
func (t *liveTable) masqueradeProblem() string {
	has := func(chain string, ok func(rule) bool) bool {
		for _, rl := range t.chains[chain] {
			if ok(rl) {
				return true
			}
		}
		return false
	}
	switch {
	case !has(chainNATPostrouting, func(rl rule) bool { return rl.hasStmt(jump(chainMasquerading)) }):
		return "hairpin: nat postrouting does not jump to " + chainMasquerading + ": marked connections are not masqueraded"
	case !has(chainMasquerading, func(rl rule) bool { return rl.hasStmt(masquerade{}) }):
		return "hairpin: chain " + chainMasquerading + " does not masquerade: marked connections keep their source"
	case !has(chainMasquerading, func(rl rule) bool { return rl.hasStmt(hairpinMatch{}) && rl.hasStmt(jump(chainMarkMasq)) }):
		return "hairpin: chain " + chainMasquerading + " does not match @" + setHairpin + ": pods reaching themselves are not masqueraded"
	case !has(chainMarkMasq, func(rl rule) bool {
		for _, s := range rl {
			if _, ok := s.(markSet); ok {
				return true
			}
		}
		return false
	}):
		return "hairpin: chain " + chainMarkMasq + " sets no mark: connections are not marked for masquerading"
	}
	return ""
}

// viewOf starts the view of a shared map element.
func (p *Proxier) viewOf(e sharedElem) dataplane.ServiceView {
	v := dataplane.ServiceView{Backends: []dataplane.BackendView{}, Entry: dataplane.EntryClusterIP, Policy: dataplane.PolicyCluster}
	if e.comment != nil {
		v.Service = *e.comment
	}
	for _, k := range []string{kindNodePort, kindExternalIP, kindLoadBalancer} {
		if s, ok := strings.CutSuffix(v.Service, k); ok {
			v.Service = s
			v.Entry = map[string]string{kindNodePort: dataplane.EntryNodePort, kindExternalIP: dataplane.EntryExternalIP, kindLoadBalancer: dataplane.EntryLoadBalancer}[k]
		}
	}
	v.VIP = dataplane.AnyAddr(p.cfg.Family)
	if e.e.key.addr.IsValid() {
		v.VIP = e.e.key.addr.String()
	}
	v.Port, v.Protocol = e.e.key.port, dataplane.Protocol(strings.ToUpper(protoName(e.e.key.proto)))
	return v
}

// follow walks chain as a new connection from off the cluster does: rules
// that only match pods (@cluster-cidrs) or the node itself (fib saddr type
// local) are skipped; an unconditional goto is followed; a source-range
// goto records the ranges and is followed; a numgen split ends the walk.
func (t *liveTable) follow(chain string, v *dataplane.ServiceView) {
	for depth := 0; depth < 4; depth++ {
		rules, ok := t.chains[chain]
		if !ok {
			v.Problems = append(v.Problems, "missing chain "+chain)
			return
		}
		next := ""
	rules:
		for _, rl := range rules {
			to, isVerdict := rl.verdictOf()
			switch {
			case len(rl) == 0:
			case rl.hasStmt(inSet{field: saddr, set: setClusterCIDRs}) && isVerdict && to.kind == goTo("").kind, rl.hasStmt(fibLocal):
			case len(rl) == 2 && isVerdict && to.kind == goTo("").kind:
				// "goto X" after a source match: the ranges allowed.
				switch s := rl[0].(type) {
				case srcRanges:
					for _, pf := range s {
						v.SourceRanges = append(v.SourceRanges, pf.String())
					}
					next = to.chain
					break rules
				case addrIs:
					if s.field == saddr {
						v.SourceRanges = append(v.SourceRanges, netip.PrefixFrom(s.addr, s.addr.BitLen()).String())
						next = to.chain
						break rules
					}
				case inSet:
					if s.field == saddr && !s.not {
						v.AffinitySeconds = t.timeouts[s.set]
					}
				}
			case len(rl) == 1 && isVerdict && to.kind == goTo("").kind:
				next = to.chain
				break rules
			default:
				if t.split(chain, rl, v) {
					return
				}
			}
		}
		if next == "" {
			if strings.HasPrefix(chain, extPrefix) {
				v.Policy = dataplane.PolicyLocal // nothing for off-cluster clients
			}
			return
		}
		if strings.HasPrefix(chain, extPrefix) && strings.HasPrefix(next, svlPrefix) {
			v.Policy = dataplane.PolicyLocal
		}
		chain = next
	}
	v.Problems = append(v.Problems, "chains nest too deep at "+chain)
}

// split computes the shares of a rule that draws from a weight map, and
// reports whether rl is one: each element lo-hi takes (hi-lo+1)/mod of the
// connections. Only the elements within the rule's draws (offset to
// offset+mod-1) count: the map's other elements are other ports'.
func (t *liveTable) split(chain string, rl rule, v *dataplane.ServiceView) bool {
	var mod, off uint32
	var name string
	var proto uint8
	dnat := false
	switch s := rl[len(rl)-1].(type) {
	case numgenVmap:
		if len(rl) != 1 {
			return false
		}
		mod, off, name = s.mod, s.off, s.m
	case numgenDNAT:
		p, ok := rl[0].(l4proto)
		if len(rl) != 2 || !ok {
			return false
		}
		mod, off, name, proto, dnat = s.mod, s.off, s.m, uint8(p), true
	default:
		return false
	}
	if strings.HasPrefix(chain, svlPrefix) {
		v.Policy = dataplane.PolicyLocal
	}
	if mod == 0 {
		v.Problems = append(v.Problems, "modulus 0")
		return true
	}
	wm := t.weights[name]
	if wm == nil {
		wm = &weightMap{}
	}
	// An endpoint is its DNAT target, or its endpoint chain's ("" for
	// the reject share of a verdict map: "return").
	type target struct {
		ap    netip.AddrPort
		chain string
	}
	// Each target's count in the order first drawn. A port has a few
	// targets, each usually one element: a search of a slice, not a map
	// per view (their writes alone were 0.02 s of explain's 1.4 CPU-s at
	// 10,000 Services x 10 endpoints, a profile of five explains).
	type count struct {
		to target
		n  uint64
	}
	var buf [16]count // on the stack: most ports have no more endpoints
	shares := buf[:0]
	var covered uint64
	first, last := uint64(off), uint64(off)+uint64(mod)-1
	for _, e := range wm.elems {
		lo, hi := max(uint64(e.lo), first), min(uint64(e.hi), last)
		if hi < lo {
			continue // another port's, or too small for a bucket
		}
		var to target
		switch {
		case dnat:
			to.ap = e.dnat
		case e.to == vReturn:
		case e.to.kind == goTo("").kind:
			to.chain = e.to.chain
		}
		if !to.ap.IsValid() && to.chain == "" && (dnat || e.to != vReturn) {
			v.Problems = append(v.Problems, fmt.Sprintf("unreadable weight element %d-%d : %s", e.lo, e.hi, e.to.text(fam{})))
			continue
		}
		i := len(shares) - 1
		for i >= 0 && shares[i].to != to {
			i--
		}
		if i < 0 {
			i, shares = len(shares), append(shares, count{to: to})
		}
		shares[i].n += hi - lo + 1
		covered += hi - lo + 1
	}
	share := func(n uint64) float64 { return dataplane.RoundShare(100 * float64(n) / float64(mod)) }
	if covered < uint64(mod) {
		if dnat {
			// What no element covers is the reject share: not DNATed,
			// refused by the filter map.
			v.RejectShare = share(uint64(mod) - covered)
		} else {
			v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections match no weight range", 100*float64(uint64(mod)-covered)/float64(mod)))
		}
	}
	v.Backends = slices.Grow(v.Backends, len(shares))
	for _, c := range shares {
		to := c.to
		ap, hairpin := to.ap, false
		switch {
		case dnat:
			// Each backend must be in the hairpin set (masqueradeProblem
			// checks the rule that matches it).
			hairpin = t.hairpin[newHairpinKey(ap.Addr(), proto, ap.Port())]
		case to.chain == "":
			v.RejectShare = share(c.n)
			continue
		default:
			if ap, hairpin = t.endpoint(to.chain); !ap.IsValid() {
				v.Problems = append(v.Problems, "endpoint chain "+to.chain+" has no DNAT")
				continue
			}
		}
		if !hairpin {
			v.Problems = append(v.Problems, "endpoint "+ap.String()+": hairpin connections are not masqueraded")
		}
		v.Backends = append(v.Backends, dataplane.BackendView{IP: ap.Addr().String(), Port: ap.Port(), Share: share(c.n)})
	}
	return true
}

// endpoint returns an endpoint chain's DNAT target and whether it marks
// hairpin connections (from the endpoint's own address) for masquerade.
func (t *liveTable) endpoint(chain string) (netip.AddrPort, bool) {
	var addr netip.AddrPort
	hairpin := false
	for _, rl := range t.chains[chain] {
		for _, s := range rl {
			switch x := s.(type) {
			case dnatTo:
				addr = netip.AddrPort(x)
			case addrIs:
				hairpin = hairpin || (x.field == saddr && rl.hasStmt(jump(chainMarkMasq)))
			}
		}
	}
	return addr, hairpin
}

// modelTable is the table a Proxier without a kernel (over knftables.Fake,
// as other packages' tests use it) explains: the model of what its syncs
// wrote, rendered again from the record (the fixed chains, every recorded
// port's chains, maps and the shared elements it owns, the node's sets).
// Nil before the first sync.
func (p *Proxier) modelTable() (*liveTable, error) {
	if !p.eng.Synced() {
		return nil, nil
	}
	t := newLiveTable()
	var fixed ops
	p.skeleton(&fixed)
	for _, o := range fixed.list {
		switch x := o.obj.(type) {
		case *ruleOp:
			t.chains[x.chain] = append(t.chains[x.chain], x.r)
		case *knftables.Chain:
			if _, ok := t.chains[x.Name]; !ok && o.verb == 'a' {
				t.chains[x.Name] = nil
			} else if o.verb == 'd' {
				delete(t.chains, x.Name)
			}
		}
	}
	for n, sp := range p.eng.AppliedPorts() {
		o := p.renderPort(sp)
		for c, rules := range o.chains {
			t.chains[c] = rules
		}
		for m, wm := range o.maps {
			// A shared map holds several ports' elements.
			if have := t.weights[m]; have != nil {
				have.elems = append(have.elems, wm.elems...)
			} else {
				t.weights[m] = &weightMap{dnat: wm.dnat, proto: wm.proto, elems: slices.Clone(wm.elems)}
			}
		}
		for s, sec := range o.sets {
			t.timeouts[s] = sec
		}
		for _, e := range o.elems {
			if p.rec.owner[e.id()] == n {
				t.shared[e.m] = append(t.shared[e.m], sharedElem{e, knftables.PtrTo(commentOf(n, e.kind))})
			}
		}
	}
	for k, n := range p.hairpin {
		if n > 0 {
			t.hairpin[k] = true
		}
	}
	for _, a := range p.nodeIPs {
		if ip, err := netip.ParseAddr(a); err == nil {
			t.nodeIPs = append(t.nodeIPs, ip)
		}
	}
	for _, es := range t.shared {
		slices.SortFunc(es, func(a, b sharedElem) int { return a.e.id().compare(b.e.id()) })
	}
	return t, nil
}
