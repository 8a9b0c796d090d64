// Addresses: the VIPs on the dummy interface steelyard0, and the node
// addresses node ports are open on (kube-proxy's netlink_linux.go).

package ipvs

import (
	"net/netip"
	"slices"

	"github.com/steelyard-net/steelyard/dataplane"
)

// nodeAddresses returns the addresses of the Proxier's family (not
// link-local: a node port there would need a zone) node ports are open on: those
// of Config.NodeAddresses that are not on the dummy interface (a node
// address list taken from every interface includes the VIPs there) and are
// not a desired clusterIP, external or load-balancer IP.
func (p *Proxier) nodeAddresses(s dataplane.State) ([]netip.Addr, error) {
	if p.cfg.NodeAddresses == nil {
		return nil, nil
	}
	all := p.cfg.NodeAddresses()
	if len(all) == 0 {
		return nil, nil
	}
	skip := map[netip.Addr]bool{}
	onLink, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return nil, err
	}
	for _, a := range onLink {
		skip[a] = true
	}
	for i := range s.Services {
		sp := &s.Services[i]
		skip[sp.VIP.IP] = true
		for _, a := range sp.ExternalIPs {
			skip[a] = true
		}
		for _, a := range sp.LoadBalancerIPs {
			skip[a] = true
		}
	}
	var out []netip.Addr
	for _, a := range all {
		a = a.Unmap()
		if p.cfg.is(a) && !a.IsLinkLocalUnicast() && !a.IsLoopback() && !skip[a] && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// syncAddresses puts every desired VIP on the dummy interface. On a partial
// Sync only VIPs new since the last one are added.
func (p *Proxier) syncAddresses(want map[dataplane.VIP]*wantService, live map[dataplane.VIP]*liveService, full bool) error {
	have := map[netip.Addr]bool{}
	if full {
		addrs, err := p.links.Addresses(p.cfg.Interface)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			have[a] = true
		}
	} else {
		for vip, a := range p.applied {
			if a.want != nil && a.want.meta.onDummy() {
				have[vip.IP] = true
			}
		}
	}
	for _, vip := range sortedVIPs(want) {
		if have[vip.IP] || !want[vip].meta.onDummy() {
			continue
		}
		if err := p.links.AddAddress(p.cfg.Interface, vip.IP); err != nil {
			return err
		}
		have[vip.IP] = true
	}
	return nil
}

// removeStaleAddresses removes from the dummy interface the VIPs that no
// desired Service uses any more.
func (p *Proxier) removeStaleAddresses(want map[dataplane.VIP]*wantService, full bool) error {
	wanted := map[netip.Addr]bool{}
	for vip, w := range want {
		if w.meta.onDummy() {
			wanted[vip.IP] = true
		}
	}
	var candidates []netip.Addr
	if full {
		addrs, err := p.links.Addresses(p.cfg.Interface)
		if err != nil {
			return err
		}
		candidates = addrs
	} else {
		for vip, a := range p.applied {
			if a.want == nil || a.want.meta.onDummy() {
				candidates = append(candidates, vip.IP)
			}
		}
	}
	for _, a := range candidates {
		if wanted[a] {
			continue
		}
		if err := p.links.DelAddress(p.cfg.Interface, a); err != nil {
			return err
		}
	}
	return nil
}
