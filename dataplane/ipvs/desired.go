// The desired state: the virtual servers (one per entry point of a Service
// port) and their destinations with integer weights, built from the State.

package ipvs

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// cachedWant is the wantServices built from a ServicePort, so the next Sync
// reuses them while the ServicePort is unchanged (most of them, most times).
type cachedWant struct {
	sp dataplane.ServicePort
	ws []*wantService
}

// wantService is one virtual server (one entry point of a Service port) as
// the desired state has it.
type wantService struct {
	vs    VirtualServer
	name  string
	meta  entryMeta
	dests map[netip.AddrPort]int
	// order is the destinations sorted, for deterministic writes.
	order []netip.AddrPort
}

// entryMeta is what an entry point is, beyond its destinations: which sets
// it belongs to, hence what the rules do with its traffic.
type entryMeta struct {
	// entry is dataplane.EntryClusterIP, EntryNodePort, EntryExternalIP or
	// EntryLoadBalancer.
	entry string
	// local is the Local traffic policy (the internal one for the
	// clusterIP, the external one for the others).
	local bool
	// drop: the policy leaves no endpoint while others exist; new
	// connections are dropped (SetDrop), as in the iptables mode.
	drop bool
	// ranges are loadBalancerSourceRanges, comma-separated, in order.
	ranges string
}

// onDummy reports whether the entry's address belongs on the dummy
// interface: every one but node ports, which use the node's own addresses.
func (m entryMeta) onDummy() bool { return m.entry != dataplane.EntryNodePort }

// comment is the entry's member comment in SetVIPs, SetExternal or
// SetExternalLocal: the Service port's name, and what explain cannot read
// from the set the member is in. No spaces: ipset restore splits on them.
func (m entryMeta) comment(name string) string {
	// Within ipset's limit, with room for "|loadbalancer".
	name = dataplane.ShortName(name, dataplane.IpsetCommentMax-32)
	switch {
	case m.entry != dataplane.EntryClusterIP:
		return name + "|" + m.entry
	case m.local:
		return name + "|" + dataplane.PolicyLocal
	}
	return name
}

// parseComment reads a comment back: the name, and the entry kind or
// policy after "|".
func parseComment(c string) (name, extra string) {
	name, extra, _ = strings.Cut(c, "|")
	return name, extra
}

// desired turns the State into virtual servers with integer weights: per
// Service port, the clusterIP, each node address with the node port, each
// external and load-balancer IP. Every backend is a destination of each of
// them; those the entry's policy (or topology) leaves out have weight 0, so
// their established connections drain instead of breaking.
func (p *Proxier) desired(s dataplane.State, nodeAddrs []netip.Addr, req dataplane.SyncRequest) map[dataplane.VIP]*wantService {
	out := make(map[dataplane.VIP]*wantService, len(s.Services))
	if !slices.Equal(nodeAddrs, p.cacheNodeAddrs) {
		p.wantCache, p.cacheNodeAddrs = nil, slices.Clone(nodeAddrs)
	}
	next := make(map[dataplane.VIP]*cachedWant, len(s.Services))
	skipped := 0
	put := func(w *wantService) {
		if o := out[w.vs.Key()]; o != nil {
			// Two Services claim one address and port (an external IP
			// twice, a node address that is also an external IP): the
			// first in name order keeps it, as kube-proxy's last-write
			// would be arbitrary.
			log.WithFields(logrus.Fields{fieldVIP: w.vs.Key().String(), fieldSvc: w.name, "owner": o.name}).Warn("entry point already used by another Service port; skipped")
			return
		}
		out[w.vs.Key()] = w
	}
	for i := range s.Services {
		sp := &s.Services[i]
		if !p.cfg.is(sp.VIP.IP) {
			// The other family's Proxier programs it (DualStack).
			skipped++
			continue
		}
		// The tracker saw its Service unchanged, or it equals the cached
		// one (the name too: another Service may have taken the VIP).
		if c := p.wantCache[sp.VIP]; c != nil && c.sp.Name == sp.Name && (!req.MayHaveChanged(sp.Name) || c.sp.Equal(sp)) {
			for _, w := range c.ws {
				put(w)
			}
			next[sp.VIP] = c
			continue
		}
		c := &cachedWant{sp: *sp, ws: p.entries(sp, nodeAddrs)}
		c.sp.Backends = slices.Clone(sp.Backends)
		c.sp.ExternalIPs = slices.Clone(sp.ExternalIPs)
		c.sp.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
		c.sp.SourceRanges = slices.Clone(sp.SourceRanges)
		for _, w := range c.ws {
			put(w)
		}
		next[sp.VIP] = c
	}
	p.wantCache = next
	if skipped > 0 && !p.warnedFamily {
		log.WithFields(logrus.Fields{"ports": skipped, "family": p.cfg.Family}).Info("Service ports of the other IP family left out: this Proxier programs one family")
		p.warnedFamily = true
	}
	return out
}

// RejectDestination is the destination of a Service port's reject share
// (dataplane.ServicePort.RejectWeight): its own clusterIP and port. The VIP
// is a local address (on the dummy interface), so IPVS hands the packet to
// the local stack unchanged (a local real server), where no socket listens
// on it: TCP gets a reset, UDP an ICMP port unreachable.
func RejectDestination(sp *dataplane.ServicePort) netip.AddrPort {
	return netip.AddrPortFrom(sp.VIP.IP, sp.VIP.Port)
}

// entries returns the virtual servers of one Service port.
func (p *Proxier) entries(sp *dataplane.ServicePort, nodeAddrs []netip.Addr) []*wantService {
	sched := sp.Scheduler
	if sched == "" {
		sched = p.cfg.Scheduler
	}
	name := sp.Name.String()
	none := len(sp.Active()) == 0
	// weights gives every backend its weight among bs, 0 for the others.
	weights := func(bs []dataplane.Backend) (map[netip.AddrPort]int, []netip.AddrPort) {
		in := map[netip.AddrPort]bool{}
		for _, b := range bs {
			in[b.Addr()] = true
		}
		fs := make([]float64, len(sp.Backends))
		for j, b := range sp.Backends {
			if in[b.Addr()] {
				fs[j] = b.Weight
			}
		}
		// The reject share is one more destination: the VIP itself (see
		// RejectDestination).
		reject := sp.RejectShare(bs) > 0
		if reject {
			fs = append(fs, sp.RejectWeight)
		}
		dests := make(map[netip.AddrPort]int, len(fs))
		var order []netip.AddrPort
		for j, iw := range IntWeights(fs) {
			a := RejectDestination(sp)
			if j < len(sp.Backends) {
				a = sp.Backends[j].Addr()
			}
			if _, dup := dests[a]; !dup {
				order = append(order, a)
			}
			dests[a] += iw
		}
		slices.SortFunc(order, netip.AddrPort.Compare)
		return dests, order
	}
	mk := func(ip netip.Addr, port uint16, meta entryMeta, dests map[netip.AddrPort]int, order []netip.AddrPort) *wantService {
		return &wantService{
			vs: VirtualServer{Address: ip, Port: port, Protocol: sp.VIP.Protocol, Scheduler: sched,
				Persistence: uint32(max(0, sp.AffinitySeconds))},
			name: name, meta: meta, dests: dests, order: order,
		}
	}
	internal := sp.InternalBackends()
	idests, iorder := weights(internal)
	ws := []*wantService{mk(sp.VIP.IP, sp.VIP.Port, entryMeta{entry: dataplane.EntryClusterIP, local: sp.InternalLocal,
		drop: len(internal) == 0 && !none}, idests, iorder)}
	if !sp.HasExternal() {
		return ws
	}
	// The external entry points share one set of destinations (read-only).
	external := sp.ExternalBackends()
	edests, eorder := weights(external)
	ext := entryMeta{local: sp.ExternalLocal, drop: len(external) == 0 && !none}
	if sp.NodePort != 0 {
		m := ext
		m.entry = dataplane.EntryNodePort
		for _, a := range nodeAddrs {
			ws = append(ws, mk(a, sp.NodePort, m, edests, eorder))
		}
	}
	for _, ip := range sp.ExternalIPs {
		m := ext
		m.entry = dataplane.EntryExternalIP
		ws = append(ws, mk(ip, sp.VIP.Port, m, edests, eorder))
	}
	var ranges []string
	for _, r := range sp.SourceRanges {
		if p.cfg.is(r.Addr()) {
			ranges = append(ranges, r.String())
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		m := ext
		m.entry, m.ranges = dataplane.EntryLoadBalancer, strings.Join(ranges, ",")
		ws = append(ws, mk(ip, sp.VIP.Port, m, edests, eorder))
	}
	return ws
}
