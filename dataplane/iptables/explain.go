package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// explainSource returns the client address the tracer uses: an address that
// is neither a pod, a node nor a VIP, so no hairpin, pod or node rule
// matches: the view shows what a client from off the cluster gets.
// Masquerade marks do not change shares.
func explainSource(is4 bool) netip.Addr {
	if is4 {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// entry is one way into a Service port found in the shared chains.
type entry struct {
	name   string
	kind   string
	target Chain // nat target, "" when only a filter rule names it
	reason string
}

type vipKey struct {
	ip    netip.Addr
	port  int
	proto string
}

// parseEntryComment splits "ns/name:port external IP has no endpoints" into
// the Service port name, the entry kind and the filter reason.
func parseEntryComment(c string) (name, kind, reason string) {
	for _, r := range []string{suffixNoEndpoints, suffixNoLocalEndpoints, suffixSourceNotAllowed, suffixRejectShare} {
		if strings.HasSuffix(c, r) {
			c, reason = strings.TrimSuffix(c, r), r
			break
		}
	}
	kind = dataplane.EntryClusterIP
	for suffix, k := range map[string]string{
		suffixExternalIP: dataplane.EntryExternalIP, suffixLoadBalancer: dataplane.EntryLoadBalancer, suffixNodePort: dataplane.EntryNodePort,
	} {
		if strings.HasSuffix(c, suffix) {
			c, kind = strings.TrimSuffix(c, suffix), k
		}
	}
	return c, kind, reason
}

// Views reads what each entry point does from a ruleset (the live kernel's,
// or a rendered one in tests). Entry points are found in steelyard's
// STEELYARD-SERVICES and STEELYARD-NODEPORTS chains; shares come from
// tracing a new connection from an off-cluster client through the built-in
// chains the kernel would run, so a missing jump or a deleted endpoint rule
// shows up as a different share rather than being assumed away.
func Views(rs *Ruleset) ([]dataplane.ServiceView, error) {
	is4 := guessFamily(rs) == 4
	anyAddr := netip.MustParseAddr(dataplane.AnyAddr(map[bool]int{true: 4, false: 6}[is4]))
	entries := map[vipKey]*entry{}
	var order []vipKey
	var nodeAddrs []netip.Addr
	collect := func(t Table, c Chain) {
		ch := rs.Chain(t, c)
		if ch == nil {
			return
		}
		for _, r := range ch.Rules {
			if c == ChainServices && t == TableNAT && r.Jump == string(ChainNodePorts) && r.Dst != nil && r.Dst.IsSingleIP() {
				if !slices.Contains(nodeAddrs, r.Dst.Addr()) {
					nodeAddrs = append(nodeAddrs, r.Dst.Addr())
				}
				continue
			}
			if r.DPort == 0 || r.Protocol == "" {
				continue
			}
			k := vipKey{anyAddr, r.DPort, r.Protocol}
			if c == ChainServices {
				if r.Dst == nil || !r.Dst.IsSingleIP() {
					continue
				}
				k.ip = r.Dst.Addr()
			}
			name, kind, reason := parseEntryComment(r.Comment)
			e, ok := entries[k]
			if !ok {
				e = &entry{}
				entries[k] = e
				order = append(order, k)
			}
			e.name, e.kind = name, kind
			if reason != "" && reason != suffixRejectShare {
				e.reason = reason
			}
			if t == TableNAT && rs.Chain(t, Chain(r.Jump)) != nil {
				e.target = Chain(r.Jump)
			}
		}
	}
	collect(TableFilter, ChainServices)
	collect(TableFilter, ChainNodePorts)
	collect(TableNAT, ChainServices)
	collect(TableNAT, ChainNodePorts)

	postrouting := map[uint32]bool{}
	reach := rs.NewReach(TableNAT)
	views := make([]dataplane.ServiceView, 0, len(order))
	for _, k := range order {
		e := entries[k]
		v := dataplane.ServiceView{
			Service:  e.name,
			VIP:      k.ip.String(),
			Port:     uint16(k.port),
			Protocol: dataplane.Protocol(strings.ToUpper(k.proto)),
			Backends: []dataplane.BackendView{},
			Entry:    e.kind,
		}
		p := Packet{Src: explainSource(is4), Dst: k.ip, Protocol: k.proto, DPort: k.port}
		filterChain := Chain("FORWARD")
		if e.kind == dataplane.EntryNodePort {
			for _, a := range nodeAddrs {
				v.NodeAddresses = append(v.NodeAddresses, a.String())
			}
			if len(nodeAddrs) == 0 {
				v.Problems = append(v.Problems, "node port open on no node address (--nodeport-addresses)")
				views = append(views, v)
				continue
			}
			p.Dst, p.DstLocal = nodeAddrs[0], true
			filterChain = "INPUT"
		}
		// A load-balancer IP behind loadBalancerSourceRanges: trace a client
		// that is allowed, then check that one that is not gets dropped.
		target := e.target
		if strings.HasPrefix(string(target), fwPrefix) {
			var ranges []netip.Prefix
			for _, r := range rs.Chain(TableNAT, target).Rules {
				if r.Src != nil && !r.NotSrc {
					ranges = append(ranges, *r.Src)
					v.SourceRanges = append(v.SourceRanges, r.Src.String())
				}
				if strings.HasPrefix(r.Jump, extPrefix) {
					target = Chain(r.Jump)
				}
			}
			if len(ranges) > 0 {
				p.Src = ranges[0].Addr()
			}
			if probs, err := checkOutsider(rs, p, ranges, filterChain); err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			} else {
				v.Problems = append(v.Problems, probs...)
			}
		}
		shares, info, err := traceShares(rs, p)
		if err != nil {
			return nil, fmt.Errorf("explain %s: %w", v.Service, err)
		}
		v.Backends, v.AffinitySeconds = shares, info.AffinitySeconds
		// The node port must do the same on every address.
		for _, a := range nodeAddrs[min(1, len(nodeAddrs)):] {
			if e.kind != dataplane.EntryNodePort {
				break
			}
			q := p
			q.Dst = a
			other, _, err := traceShares(rs, q)
			if err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			}
			if !sameShares(other, shares) {
				v.Problems = append(v.Problems, fmt.Sprintf("node port on %s splits differently from %s", a, nodeAddrs[0]))
			}
		}
		if e.kind == dataplane.EntryClusterIP && len(v.Backends) > 0 && target != "" {
			probs, err := checkHairpin(rs, reach, target, p, v.Backends, postrouting)
			if err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			}
			v.Problems = append(v.Problems, probs...)
		}
		if len(v.Backends) > 0 {
			// A share left without DNAT: refused in the filter table?
			// Rounding leaves at most 5e-5 points per backend.
			if rest := 100 - sumShares(v.Backends); rest > 0.01 {
				filter, err := traceIfPresent(rs, TableFilter, filterChain, p)
				if err != nil {
					return nil, fmt.Errorf("explain %s: %w", v.Service, err)
				}
				refused := 0.0
				for _, o := range filter {
					if o.Verdict == "REJECT" || o.Verdict == "DROP" {
						refused += o.Probability
					}
				}
				if refused > 0.5 {
					v.RejectShare = dataplane.RoundShare(rest)
				} else {
					v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections are neither DNATed nor refused", rest))
				}
			}
		}
		if len(v.Backends) == 0 {
			// No DNAT: is a new connection refused or dropped on its way?
			filter, err := traceIfPresent(rs, TableFilter, filterChain, p)
			if err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			}
			for _, o := range filter {
				if o.Verdict == "REJECT" && o.Probability > 0.5 {
					v.Reject = true
				}
				if o.Verdict == "DROP" && o.Probability > 0.5 {
					v.Drop = true
				}
			}
		}
		if !v.Reject {
			v.Policy = policyOf(rs, e, target)
		}
		views = append(views, v)
	}
	dataplane.SortViews(views)
	return views, nil
}

// guessFamily returns 6 when the first address in STEELYARD-SERVICES is
// IPv6 (an ip6tables ruleset), else 4.
func guessFamily(rs *Ruleset) int {
	for _, t := range []Table{TableNAT, TableFilter} {
		if ch := rs.Chain(t, ChainServices); ch != nil {
			for _, r := range ch.Rules {
				if r.Dst != nil {
					if r.Dst.Addr().Is4() {
						return 4
					}
					return 6
				}
			}
		}
	}
	return 4
}

// traceShares traces p from nat PREROUTING (OUTPUT when the source is the
// node) and returns the backends reached with their shares.
func traceShares(rs *Ruleset, p Packet) ([]dataplane.BackendView, TraceInfo, error) {
	start := Chain("PREROUTING")
	if p.SrcLocal {
		start = "OUTPUT"
	}
	out := []dataplane.BackendView{}
	if rs.Chain(TableNAT, start) == nil {
		return out, TraceInfo{}, nil
	}
	nat, info, err := rs.TraceInfo(TableNAT, start, p)
	if err != nil {
		return nil, info, err
	}
	for _, o := range nat {
		if o.Verdict == "DNAT" && o.Probability > 0 {
			out = append(out, dataplane.BackendView{
				IP: o.DNAT.Addr().String(), Port: o.DNAT.Port(), Share: dataplane.RoundShare(100 * o.Probability),
			})
		}
	}
	return out, info, nil
}

func sumShares(bs []dataplane.BackendView) float64 {
	var sum float64
	for _, b := range bs {
		sum += b.Share
	}
	return sum
}

func sameShares(a, b []dataplane.BackendView) bool {
	return slices.EqualFunc(a, b, func(x, y dataplane.BackendView) bool {
		return x.IP == y.IP && x.Port == y.Port && x.Share == y.Share
	})
}

// policyOf tells the traffic policy of an entry from the chains it leads
// to: a clusterIP jumping to a local chain, or an external chain that
// treats the node's own traffic apart (only Local policy needs that), or a
// drop for want of a local endpoint.
func policyOf(rs *Ruleset, e *entry, target Chain) string {
	if e.reason == suffixNoLocalEndpoints || strings.HasPrefix(string(target), svlPrefix) {
		return dataplane.PolicyLocal
	}
	if strings.HasPrefix(string(target), extPrefix) {
		for _, r := range rs.Chain(TableNAT, target).Rules {
			if r.SrcLocal > 0 {
				return dataplane.PolicyLocal
			}
		}
	}
	return dataplane.PolicyCluster
}

// checkOutsider traces a client outside ranges and reports a problem unless
// its new connection is dropped.
func checkOutsider(rs *Ruleset, p Packet, ranges []netip.Prefix, filterChain Chain) ([]string, error) {
	candidates := []string{"0.0.0.0", "255.255.255.254", "198.18.255.254", "::", "2001:2:ffff::1", "ffff::1"}
	var out netip.Addr
	for _, c := range candidates {
		a := netip.MustParseAddr(c)
		if a.Is4() != p.Dst.Is4() || slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return r.Contains(a) }) {
			continue
		}
		out = a
		break
	}
	if !out.IsValid() {
		return nil, nil
	}
	p.Src = out
	shares, _, err := traceShares(rs, p)
	if err != nil {
		return nil, err
	}
	if len(shares) > 0 {
		return []string{fmt.Sprintf("a client outside loadBalancerSourceRanges (%s) is forwarded", out)}, nil
	}
	filter, err := traceIfPresent(rs, TableFilter, filterChain, p)
	if err != nil {
		return nil, err
	}
	for _, o := range filter {
		if o.Verdict != "DROP" && o.Verdict != "REJECT" && o.Probability > 0 {
			return []string{fmt.Sprintf("a client outside loadBalancerSourceRanges (%s) is not dropped", out)}, nil
		}
	}
	return nil, nil
}

func traceIfPresent(rs *Ruleset, t Table, c Chain, p Packet) ([]Outcome, error) {
	if rs.Chain(t, c) == nil {
		return nil, nil
	}
	return rs.Trace(t, c, p)
}

// checkHairpin traces a new connection from each backend to its own VIP,
// starting at the Service chain (not PREROUTING, which would cost a walk
// of every Service per backend) and entering only the chains that can
// lead back to the backend (reach: not every endpoint chain per backend,
// m^2 per Service), and checks that the connection that lands
// back on the backend leaves POSTROUTING masqueraded: without that, the
// pod would answer itself and the connection would hang.
func checkHairpin(rs *Ruleset, reach *Reach, svc Chain, p Packet, backends []dataplane.BackendView, masq map[uint32]bool) ([]string, error) {
	var problems []string
	for _, b := range backends {
		src, err := netip.ParseAddr(b.IP)
		if err != nil {
			return nil, err
		}
		hp := p
		hp.Src = src
		outs, err := reach.TraceTo(svc, hp, src)
		if err != nil {
			return nil, err
		}
		for _, o := range outs {
			if o.Verdict != "DNAT" || o.DNAT.Addr() != src || o.Probability == 0 {
				continue
			}
			ok, seen := masq[o.Mark]
			if !seen {
				post, err := traceIfPresent(rs, TableNAT, "POSTROUTING", Packet{Src: src, Dst: src, Protocol: p.Protocol, DPort: int(o.DNAT.Port()), Mark: o.Mark})
				if err != nil {
					return nil, err
				}
				ok = len(post) > 0
				for _, po := range post {
					if po.Verdict != "MASQUERADE" && po.Probability > 0 {
						ok = false
					}
				}
				masq[o.Mark] = ok
			}
			if !ok {
				problems = append(problems, fmt.Sprintf("hairpin: a connection from %s back to itself is not masqueraded", b.IP))
			}
		}
	}
	return problems, nil
}
