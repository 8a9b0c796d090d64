package controller

import (
	"net/netip"

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

// flowKey is one address a UDP Service port is reached at.
type flowKey struct {
	addr netip.AddrPort
}

// udpTarget is what one such address leads to after a sync.
type udpTarget struct {
	// backends are the endpoints a flow may keep talking to: ready or
	// serving. A weight-0 (drained) endpoint stays here: its established
	// flows keep flowing, as for TCP.
	backends map[netip.AddrPort]bool
	// active tells whether new flows are forwarded (some weight > 0).
	active bool
}

// serviceAddrs returns the addresses clients reach sp at. Today that is the
// ClusterIP VIP; NodePorts and external IPs join here, and every stale-flow
// rule below then covers them too.
func serviceAddrs(sp *dataplane.ServicePort) []netip.AddrPort {
	return []netip.AddrPort{netip.AddrPortFrom(sp.VIP.IP, sp.VIP.Port)}
}

// udpTargets indexes the UDP Service ports of s by address.
func udpTargets(s *dataplane.State) map[flowKey]*udpTarget {
	out := map[flowKey]*udpTarget{}
	for i := range s.Services {
		sp := &s.Services[i]
		if sp.VIP.Protocol != dataplane.UDP {
			continue
		}
		for _, a := range serviceAddrs(sp) {
			k := flowKey{a}
			t := out[k]
			if t == nil {
				t = &udpTarget{backends: map[netip.AddrPort]bool{}}
				out[k] = t
			}
			for _, b := range sp.Backends {
				if b.Ready || b.Serving {
					t.backends[b.Addr()] = true
				}
				if b.Weight > 0 {
					t.active = true
				}
			}
		}
	}
	return out
}

// StaleFlows returns the filters that select the UDP conntrack entries the
// change from prev to next leaves pointing at the wrong place, the way
// kube-proxy clears them:
//
//   - an endpoint left a Service port (removed, or neither ready nor
//     serving): entries from that address to that endpoint;
//   - a Service port went away: every entry to its address;
//   - a Service port got its first active endpoint: entries to its address
//     that were never translated (their reply comes from the address
//     itself), which would otherwise keep bypassing the new rules.
//
// Entries of endpoints that stay (also drained, weight-0 ones) and of other
// addresses are never selected. The result is empty when nothing changed.
func StaleFlows(prev, next *dataplane.State) []conntrack.Filter {
	before, after := udpTargets(prev), udpTargets(next)
	var out []conntrack.Filter
	for i := range prev.Services {
		sp := &prev.Services[i]
		if sp.VIP.Protocol != dataplane.UDP {
			continue
		}
		for _, a := range serviceAddrs(sp) {
			t := after[flowKey{a}]
			if t == nil {
				out = append(out, conntrack.Filter{Protocol: dataplane.UDP, OrigDst: a.Addr(), OrigDstPort: a.Port()})
				continue
			}
			for _, b := range sp.Backends {
				if !(b.Ready || b.Serving) {
					continue // its flows were cleared when it stopped serving
				}
				if !t.backends[b.Addr()] {
					out = append(out, conntrack.Filter{Protocol: dataplane.UDP, OrigDst: a.Addr(), OrigDstPort: a.Port(), ReplySrc: b.IP, ReplySrcPort: b.Port})
				}
			}
		}
	}
	for i := range next.Services {
		sp := &next.Services[i]
		if sp.VIP.Protocol != dataplane.UDP {
			continue
		}
		for _, a := range serviceAddrs(sp) {
			t := after[flowKey{a}]
			if was := before[flowKey{a}]; t.active && (was == nil || !was.active) {
				out = append(out, conntrack.Filter{Protocol: dataplane.UDP, OrigDst: a.Addr(), OrigDstPort: a.Port(), ReplySrc: a.Addr()})
			}
		}
	}
	return dedupe(out)
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

// StaleFlowsNow returns filters for the live flows that point at an
// endpoint next does not have: used on the first sync after a start, when
// there is no previous state to compare with (endpoints may have left
// while the agent was down). Flows to current endpoints, un-translated
// flows and flows to other addresses are kept, so a restart never breaks a
// live UDP flow (kubernetes#122740).
func StaleFlowsNow(flows []conntrack.Flow, next *dataplane.State) []conntrack.Filter {
	targets := udpTargets(next)
	var out []conntrack.Filter
	for _, f := range flows {
		if f.Protocol != dataplane.UDP {
			continue
		}
		t := targets[flowKey{f.OrigDst}]
		if t == nil || f.ReplySrc.Addr() == f.OrigDst.Addr() || t.backends[f.ReplySrc] {
			continue
		}
		out = append(out, conntrack.Filter{Protocol: dataplane.UDP, OrigDst: f.OrigDst.Addr(), OrigDstPort: f.OrigDst.Port(), ReplySrc: f.ReplySrc.Addr(), ReplySrcPort: f.ReplySrc.Port()})
	}
	return dedupe(out)
}

// cleanConntrack runs after every successful Dataplane.Sync (the new rules
// are in place, so the next datagram of a cleared flow takes a current
// decision) and deletes the stale UDP entries. A failed deletion is logged
// and retried on the next sync, which compares with the same previous state.
func (a *Agent) cleanConntrack(next dataplane.State) {
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
	} else {
		filters = StaleFlows(a.applied, &next)
	}
	if len(filters) > 0 {
		n, err := a.Conntrack.Delete(filters...)
		if err != nil {
			conntrackLog.WithError(err).WithField("filters", len(filters)).Error("deleting stale UDP conntrack entries failed; retrying on the next sync")
			return
		}
		for _, f := range filters {
			conntrackLog.WithField("filter", f.String()).Debug("stale UDP flows")
		}
		conntrackLog.WithFields(logrus.Fields{"deleted": n, "filters": len(filters)}).Info("deleted stale UDP conntrack entries")
	}
	a.applied = &next
}
