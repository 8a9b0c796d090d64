package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Explain reads the live IPVS table (steelyard's virtual servers: addresses
// on the dummy interface or entries in the sets) and returns what each entry
// point does: share = weight / sum of the weights. Names, entry kinds and
// policies come from the set members (the sets are what the rules act on:
// masquerading, drops, source ranges); the node port's virtual servers, one
// per node address, make one view, as in the iptables mode.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	sets, err := p.sets.List(setNames())
	if err != nil {
		return nil, err
	}
	isOurs, names, err := p.ours(sets)
	if err != nil {
		return nil, err
	}
	addrs, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return nil, err
	}
	onLink := map[netip.Addr]bool{}
	for _, a := range addrs {
		onLink[a] = true
	}
	drops, fw, ranges := memberVIPs(sets[SetDrop]), memberVIPs(sets[SetFirewall]), sourceRanges(sets[SetSourceRanges])
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return nil, err
	}
	var views []dataplane.ServiceView
	nodePorts := map[dataplane.VIP]int{} // port/protocol -> index in views
	for _, vs := range vss {
		if !isOurs(vs) {
			continue
		}
		rss, err := p.ipvs.RealServers(vs)
		if err != nil {
			return nil, err
		}
		key := vs.Key()
		sc := names[key]
		v := viewOf(vs, sc, rss, drops[key], onLink)
		if fw[key] {
			v.SourceRanges = ranges[key]
			if len(v.SourceRanges) == 0 {
				v.Problems = append(v.Problems, "load-balancer IP restricted to no source: every new connection is dropped")
			}
		}
		if sc.set == "" {
			f := p.cfg.Family
			v.Problems = append(v.Problems, fmt.Sprintf("entry point is in none of the sets %s, %s, %s (no masquerading for it)",
				SetName(f, SetVIPs), SetName(f, SetExternal), SetName(f, SetExternalLocal)))
		}
		if v.Entry != dataplane.EntryNodePort {
			if !onLink[vs.Address] {
				v.Problems = append(v.Problems, fmt.Sprintf("address is not on %s: the kernel does not deliver its packets to IPVS", p.cfg.Interface))
			}
			views = append(views, v)
			continue
		}
		// Node ports: one view per port, listing the node addresses; every
		// address must split the same way.
		np := dataplane.VIP{Port: vs.Port, Protocol: vs.Protocol}
		i, seen := nodePorts[np]
		if !seen {
			v.VIP = dataplane.AnyAddr(p.cfg.Family)
			v.NodeAddresses = []string{vs.Address.String()}
			nodePorts[np] = len(views)
			views = append(views, v)
			continue
		}
		first := &views[i]
		first.NodeAddresses = append(first.NodeAddresses, vs.Address.String())
		if !sameSplit(first, &v) {
			first.Problems = append(first.Problems, fmt.Sprintf("node port on %s splits differently from %s", vs.Address, first.NodeAddresses[0]))
		}
	}
	for i := range views {
		slices.SortFunc(views[i].NodeAddresses, func(a, b string) int {
			return netip.MustParseAddr(a).Compare(netip.MustParseAddr(b))
		})
	}
	dataplane.SortViews(views)
	return views, nil
}

// sameSplit reports whether two views send new connections alike.
func sameSplit(a, b *dataplane.ServiceView) bool {
	if a.Drop != b.Drop || a.Reject != b.Reject || a.Policy != b.Policy || len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		if a.Backends[i] != b.Backends[i] {
			return false
		}
	}
	return true
}

// memberVIPs returns the entry points among a set's entries.
func memberVIPs(entries []SetEntry) map[dataplane.VIP]bool {
	out := map[dataplane.VIP]bool{}
	for _, e := range entries {
		if vip, ok := parseVIPMember(e.Member); ok {
			out[vip] = true
		}
	}
	return out
}

// sourceRanges returns the allowed source ranges of each load-balancer
// entry (SetSourceRanges' entries), in the Service's order (the members'
// comments).
func sourceRanges(entries []SetEntry) map[dataplane.VIP][]string {
	type ranked struct {
		pos int
		r   string
	}
	by := map[dataplane.VIP][]ranked{}
	for _, e := range entries {
		i := strings.LastIndex(e.Member, ",")
		if i < 0 {
			continue
		}
		vip, ok := parseVIPMember(e.Member[:i])
		pfx, err := netip.ParsePrefix(e.Member[i+1:])
		if !ok || err != nil {
			continue
		}
		pos, err := strconv.Atoi(e.Comment)
		if err != nil {
			pos = 1 << 30 // no position: after the others
		}
		by[vip] = append(by[vip], ranked{pos, pfx.String()})
	}
	out := map[dataplane.VIP][]string{}
	for vip, rs := range by {
		sort.SliceStable(rs, func(i, j int) bool {
			if rs[i].pos != rs[j].pos {
				return rs[i].pos < rs[j].pos
			}
			return rs[i].r < rs[j].r
		})
		for _, r := range rs {
			out[vip] = append(out[vip], r.r)
		}
	}
	return out
}

// viewOf builds the view of one virtual server. The kernel's behaviour
// decides: an entry in SetDrop drops new connections (the filter rule runs
// before IPVS); otherwise the destinations with a positive weight share
// them, and with none IPVS refuses them (ICMP port unreachable).
//
// A destination on the dummy interface (onLink) is a VIP: the reject
// share of RejectDestination, not a backend.
func viewOf(vs VirtualServer, sc setComment, rss []RealServer, drop bool, onLink map[netip.Addr]bool) dataplane.ServiceView {
	name, extra := parseComment(sc.comment)
	v := dataplane.ServiceView{
		Service:  name,
		VIP:      vs.Address.String(),
		Port:     vs.Port,
		Protocol: vs.Protocol,
		Backends: []dataplane.BackendView{},
		Entry:    dataplane.EntryClusterIP,
		Policy:   dataplane.PolicyCluster,
		// IPVS persistence is ClientIP session affinity.
		AffinitySeconds: int(vs.Persistence),
	}
	switch sc.set {
	case SetVIPs:
		if extra == dataplane.PolicyLocal {
			v.Policy = dataplane.PolicyLocal
		}
	case SetExternal, SetExternalLocal:
		v.Entry = extra
		if sc.set == SetExternalLocal {
			v.Policy = dataplane.PolicyLocal
		}
	}
	if drop {
		v.Drop = true
		return v
	}
	total := 0
	for _, r := range rss {
		if r.Weight > 0 {
			total += r.Weight
		}
	}
	for _, r := range rss {
		if r.Weight <= 0 {
			continue
		}
		if onLink[r.Address] {
			v.RejectShare += dataplane.RoundShare(100 * float64(r.Weight) / float64(total))
			continue
		}
		v.Backends = append(v.Backends, dataplane.BackendView{IP: r.Address.String(), Port: r.Port,
			Share: dataplane.RoundShare(100 * float64(r.Weight) / float64(total))})
	}
	// IPVS answers a virtual server without a usable destination with an
	// ICMP port unreachable: a reject, before any policy applies.
	if len(v.Backends) == 0 {
		v.Reject, v.Policy = true, ""
	}
	return v
}

// Cleanup removes steelyard's virtual servers of the Proxier's family, the
// dummy interface, the rules and the sets, and nothing else.
// The IPv6 Proxier leaves the dummy interface to the IPv4 one, which
// dataplane.DualStack cleans last: the IPv4 VIPs on it tell which virtual
// servers are steelyard's.
func (p *Proxier) Cleanup() error { return p.cleanup(p.cfg.Family == 4) }

// cleanup is Cleanup; the dummy interface is deleted only with
// deleteDummy.
func (p *Proxier) cleanup(deleteDummy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied, p.ready = nil, false
	p.eng.Reset()
	p.draining = map[dataplane.VIP]map[netip.AddrPort]time.Time{}
	isOurs, _, err := p.ours(nil)
	if err != nil {
		return err
	}
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return err
	}
	var errs []error
	n := 0
	for _, vs := range vss {
		if !isOurs(vs) {
			continue
		}
		if err := p.ipvs.DeleteVirtualServer(vs); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	if !deleteDummy {
		for _, a := range addrsOrNil(p.links.Addresses(p.cfg.Interface)) {
			if err := p.links.DelAddress(p.cfg.Interface, a); err != nil {
				errs = append(errs, err)
			}
		}
	} else if err := p.links.DeleteDummy(p.cfg.Interface); err != nil {
		errs = append(errs, err)
	}
	if err := cleanupRules(p.ipt); err != nil {
		errs = append(errs, err)
	} else {
		// A set referenced by a rule cannot be destroyed: rules go first.
		for _, st := range setTypes {
			if err := p.sets.Destroy(st.name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	log.WithFields(logrus.Fields{"services": n, "family": p.cfg.Family}).Info("removed steelyard's IPVS services, interface, rules and sets")
	return errors.Join(errs...)
}

func addrsOrNil(a []netip.Addr, err error) []netip.Addr {
	if err != nil {
		return nil
	}
	return a
}
