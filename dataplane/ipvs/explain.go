package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Explain reads the live IPVS table (steelyard's virtual servers: VIPs on
// the dummy interface or in the VIP set) and returns what each VIP does:
// share = weight / sum of the weights. Names come from the VIP set's
// comments.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	isOurs, names, err := p.ours()
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
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return nil, err
	}
	var views []dataplane.ServiceView
	for _, vs := range vss {
		if !isOurs(vs) {
			continue
		}
		rss, err := p.ipvs.RealServers(vs)
		if err != nil {
			return nil, err
		}
		views = append(views, viewOf(vs, names[vs.Key()], rss, onLink[vs.Address], p.cfg.Interface))
	}
	dataplane.SortViews(views)
	return views, nil
}

func viewOf(vs VirtualServer, name string, rss []RealServer, onLink bool, iface string) dataplane.ServiceView {
	v := dataplane.ServiceView{
		Service:  name,
		VIP:      vs.Address.String(),
		Port:     vs.Port,
		Protocol: vs.Protocol,
		Backends: []dataplane.BackendView{},
		// IPVS persistence is ClientIP session affinity.
		AffinitySeconds: int(vs.Persistence),
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
		v.Backends = append(v.Backends, dataplane.BackendView{IP: r.Address.String(), Port: r.Port,
			Share: dataplane.RoundShare(100 * float64(r.Weight) / float64(total))})
	}
	// IPVS answers a virtual server without a usable destination with an
	// ICMP port unreachable: a reject.
	v.Reject = len(v.Backends) == 0
	if !onLink {
		v.Problems = append(v.Problems, fmt.Sprintf("VIP is not on %s: the kernel does not deliver its packets to IPVS", iface))
	}
	if name == "" {
		v.Problems = append(v.Problems, fmt.Sprintf("VIP is missing from the ipset %s (no masquerading for it)", SetVIPs))
	}
	return v
}

// Cleanup removes steelyard's virtual servers, the dummy interface, the
// masquerade rules and the sets, and nothing else.
func (p *Proxier) Cleanup() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.applied, p.ready = nil, false
	p.draining = map[dataplane.VIP]map[netip.AddrPort]time.Time{}
	isOurs, _, err := p.ours()
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
	if err := p.links.DeleteDummy(p.cfg.Interface); err != nil {
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
	log.WithField("services", n).Info("removed steelyard's IPVS services, interface, rules and sets")
	return errors.Join(errs...)
}
