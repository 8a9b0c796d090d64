package controller

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// ConntrackCleaner lists and deletes conntrack entries;
// dataplane/conntrack's Netlink and Fake implement it.
type ConntrackCleaner interface {
	List() ([]conntrack.Flow, error)
	Delete(filters ...conntrack.Filter) (int, error)
}

var (
	_ ConntrackCleaner = (*conntrack.Netlink)(nil)
	_ ConntrackCleaner = (*conntrack.Fake)(nil)
)

var conntrackLog = logrus.WithField("subsys", "conntrack")

// entryPoint is one address a UDP Service port is reached at: an IP and
// port (the VIP, an external or load-balancer IP, with the Service port),
// or a node port, written as the unspecified address of the port's family
// with the node port ("any of this node's addresses").
type entryPoint struct {
	addr netip.AddrPort
}

// nodePortEntry returns the entry point of node port port in the family of ip.
func nodePortEntry(ip netip.Addr, port uint16) entryPoint {
	if ip.Unmap().Is4() {
		return entryPoint{netip.AddrPortFrom(netip.IPv4Unspecified(), port)}
	}
	return entryPoint{netip.AddrPortFrom(netip.IPv6Unspecified(), port)}
}

func (e entryPoint) isNodePort() bool { return e.addr.Addr().IsUnspecified() }

func (e entryPoint) family() int {
	if e.addr.Addr().Is4() {
		return 4
	}
	return 6
}

// filter returns the filter for the UDP entries sent to e.
func (e entryPoint) filter() conntrack.Filter {
	if e.isNodePort() {
		// The family, since the filter names no address: the node port
		// of the Service port of the other family may stay as it is.
		return conntrack.Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: e.addr.Port(), Family: e.family()}
	}
	return conntrack.Filter{Protocol: dataplane.UDP, OrigDst: e.addr.Addr(), OrigDstPort: e.addr.Port()}
}

// toBackend returns the filter for the entries sent to e and translated to b.
func (e entryPoint) toBackend(b netip.AddrPort) conntrack.Filter {
	f := e.filter()
	f.ReplySrc, f.ReplySrcPort, f.Family = b.Addr(), b.Port(), 0
	return f
}

// untranslated returns the filter for the entries sent to e that were
// never translated.
func (e entryPoint) untranslated() conntrack.Filter {
	f := e.filter()
	f.Untranslated = true
	return f
}

// udpTarget is what one entry point leads to after a sync.
type udpTarget struct {
	// backends are the endpoints a flow may keep talking to: ready or
	// serving. As in kube-proxy, neither weights nor traffic policies nor
	// topology count here: an endpoint drained to weight 0, or one a Local
	// policy or a zone hint keeps new flows away from, keeps its
	// established flows, as it would for TCP.
	backends map[netip.AddrPort]bool
	// active tells whether new flows through this entry point are
	// forwarded: the policy of the entry point (internal for the VIP,
	// external for the others) leaves some endpoint.
	active bool
}

// entryPoints returns the addresses clients reach sp at, and whether each
// one follows the external traffic policy.
func entryPoints(sp *dataplane.ServicePort) (eps []entryPoint, external []bool) {
	add := func(a netip.AddrPort, ext bool) {
		eps, external = append(eps, entryPoint{a}), append(external, ext)
	}
	add(netip.AddrPortFrom(sp.VIP.IP, sp.VIP.Port), false)
	if sp.NodePort != 0 {
		add(nodePortEntry(sp.VIP.IP, sp.NodePort).addr, true)
	}
	for _, ip := range sp.ExternalIPs {
		add(netip.AddrPortFrom(ip, sp.VIP.Port), true)
	}
	for _, ip := range sp.LoadBalancerIPs {
		add(netip.AddrPortFrom(ip, sp.VIP.Port), true)
	}
	return eps, external
}

// udpTargets indexes the UDP Service ports of s by entry point.
func udpTargets(s *dataplane.State) map[entryPoint]*udpTarget {
	out := map[entryPoint]*udpTarget{}
	for i := range s.Services {
		sp := &s.Services[i]
		if sp.VIP.Protocol != dataplane.UDP {
			continue
		}
		eps, external := entryPoints(sp)
		for j, e := range eps {
			t := out[e]
			if t == nil {
				t = &udpTarget{backends: map[netip.AddrPort]bool{}}
				out[e] = t
			}
			for _, b := range sp.Backends {
				if b.Ready || b.Serving {
					t.backends[b.Addr()] = true
				}
			}
			if external[j] {
				t.active = t.active || len(sp.ExternalBackends()) > 0
			} else {
				t.active = t.active || len(sp.InternalBackends()) > 0
			}
		}
	}
	return out
}

// StaleFlows returns the filters that select the UDP conntrack entries the
// change from prev to next leaves pointing at the wrong place, the way
// kube-proxy clears them. Each rule applies to every entry point of a UDP
// Service port: the VIP, the node port (on any of this node's addresses),
// each external IP and each load-balancer IP:
//
//   - an endpoint left a Service port (removed, or neither ready nor
//     serving): entries from each entry point to that endpoint;
//   - an entry point went away (the Service port, or its node port, or one
//     of its external or load-balancer IPs): every entry to it;
//   - an entry point got its first endpoint under its traffic policy (or
//     appeared with one): entries to it that were never translated, which
//     would otherwise keep bypassing the new rules.
//
// A change of traffic policy, topology or weight deletes nothing: an
// endpoint that still serves keeps its established flows, as kube-proxy
// does and as TCP connections do. Entries of endpoints that stay and of
// other addresses are never selected. The result is empty when nothing
// changed. TCP and SCTP entries are never selected: both protocols end
// their connections with packets conntrack sees, and kube-proxy too clears
// only UDP (kubernetes#115299 found its SCTP clearing had never run).
func StaleFlows(prev, next *dataplane.State) []conntrack.Filter {
	before, after := udpTargets(prev), udpTargets(next)
	var out []conntrack.Filter
	for i := range prev.Services {
		sp := &prev.Services[i]
		if sp.VIP.Protocol != dataplane.UDP {
			continue
		}
		eps, _ := entryPoints(sp)
		for _, e := range eps {
			t := after[e]
			if t == nil {
				out = append(out, e.filter())
				continue
			}
			for _, b := range sp.Backends {
				if !(b.Ready || b.Serving) {
					continue // its flows were cleared when it stopped serving
				}
				if !t.backends[b.Addr()] {
					out = append(out, e.toBackend(b.Addr()))
				}
			}
		}
	}
	for e, t := range after {
		if was := before[e]; t.active && (was == nil || !was.active) {
			out = append(out, e.untranslated())
		}
	}
	return sortFilters(dedupe(out))
}

// sortFilters puts filters in a stable order (the map walk above is not),
// for logs and tests.
func sortFilters(fs []conntrack.Filter) []conntrack.Filter {
	slices.SortStableFunc(fs, func(a, b conntrack.Filter) int { return cmp.Compare(a.String(), b.String()) })
	return fs
}

func dedupe(fs []conntrack.Filter) []conntrack.Filter {
	seen := map[conntrack.Filter]bool{}
	out := fs[:0]
	for _, f := range fs {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// StaleFlowsNow returns filters for the live flows that next makes stale:
// used on the first sync after a start, when there is no previous state to
// compare with (endpoints may have left while the agent was down). Like
// kube-proxy's reconciliation, it selects, for each entry point of a UDP
// Service port, the entries translated to an endpoint next does not have,
// and the untranslated ones when the entry point forwards new flows. Flows
// to current endpoints and flows to other addresses are kept, so a restart
// never breaks a live UDP flow (kubernetes#122740). A flow to a node port is
// recognised by its port; the filter also requires its destination to be one
// of this node's addresses.
func StaleFlowsNow(flows []conntrack.Flow, next *dataplane.State) []conntrack.Filter {
	targets := udpTargets(next)
	var out []conntrack.Filter
	for _, f := range flows {
		if f.Protocol != dataplane.UDP {
			continue
		}
		dst := netip.AddrPortFrom(f.OrigDst.Addr().Unmap(), f.OrigDst.Port())
		e := entryPoint{dst}
		t := targets[e]
		nodePort := false
		if t == nil {
			e = nodePortEntry(dst.Addr(), dst.Port())
			if t = targets[e]; t == nil {
				continue
			}
			nodePort = true
		}
		untranslated := f.ReplySrc == f.OrigDst
		if untranslated && !t.active || !untranslated && t.backends[f.ReplySrc] {
			continue
		}
		flt := conntrack.Filter{Protocol: dataplane.UDP, OrigDst: dst.Addr(), OrigDstPort: dst.Port(), OrigDstLocal: nodePort}
		if untranslated {
			flt.Untranslated = true
		} else {
			flt.ReplySrc, flt.ReplySrcPort = f.ReplySrc.Addr(), f.ReplySrc.Port()
		}
		out = append(out, flt)
	}
	return dedupe(out)
}

// udpPorts is s with only its UDP Service ports, in a new array: all
// StaleFlows reads of the previous State, kept without keeping the whole
// State (every TCP port and its backends) alive into the next Build.
func udpPorts(s *dataplane.State) *dataplane.State {
	out := &dataplane.State{}
	for i := range s.Services {
		if sp := &s.Services[i]; sp.VIP.Protocol == dataplane.UDP {
			out.Services = append(out.Services, *sp)
		}
	}
	return out
}

// udpPortsOf returns the UDP ports of the Services of changed in s (sorted).
func udpPortsOf(s *dataplane.State, changed map[dataplane.ServiceName]bool) *dataplane.State {
	out := &dataplane.State{}
	for n := range changed {
		ports := s.PortsOf(n)
		for i := range ports {
			if ports[i].VIP.Protocol == dataplane.UDP {
				out.Services = append(out.Services, ports[i])
			}
		}
	}
	out.Sort()
	return out
}

// cleanConntrack runs after every successful Dataplane.Sync (the new rules
// are in place, so the next datagram of a cleared flow takes a current
// decision) and deletes the stale UDP entries. A failed deletion is logged
// and retried on the next sync, which compares with the same previous state.
//
// changed, when not nil, names every Service whose ports differ from the
// last sync's: only their UDP ports are compared (an entry point that
// moves between Services changes both). Comparing every port copied the
// UDP ports out of 10,000 on each change, a quarter of an endpoint
// change's CPU (BenchmarkEndpointChange10kx10).
func (a *Agent) cleanConntrack(next dataplane.State, changed map[dataplane.ServiceName]bool) {
	if a.Conntrack == nil {
		return
	}
	var filters []conntrack.Filter
	if a.applied == nil {
		flows, err := a.Conntrack.List()
		if err != nil {
			conntrackLog.WithError(err).Warn("cannot list conntrack entries; stale UDP flows from before the start stay")
		} else {
			filters = StaleFlowsNow(flows, &next)
		}
	} else if changed != nil && !a.conntrackRetry {
		prev, cur := udpPortsOf(a.applied, changed), udpPortsOf(&next, changed)
		filters = StaleFlows(prev, cur)
		if len(prev.Services) == 0 && len(cur.Services) == 0 {
			return // no UDP port changed: a.applied stays right
		}
	} else {
		filters = StaleFlows(a.applied, &next)
	}
	if len(filters) > 0 {
		n, err := a.Conntrack.Delete(filters...)
		if err != nil {
			conntrackLog.WithError(err).WithField("filters", len(filters)).Error("deleting stale UDP conntrack entries failed; retrying on the next sync")
			// The next sync may not change these Services: it compares
			// every port with a.applied.
			a.conntrackRetry = true
			return
		}
		for _, f := range filters {
			conntrackLog.WithField("filter", f.String()).Debug("stale UDP flows")
		}
		conntrackLog.WithFields(logrus.Fields{"deleted": n, "filters": len(filters)}).Info("deleted stale UDP conntrack entries")
	}
	a.applied = udpPorts(&next)
	a.conntrackRetry = false
}
