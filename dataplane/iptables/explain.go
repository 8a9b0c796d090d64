package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// explainSource is the client address the tracer uses: an address that is
// neither a pod nor a VIP, so no hairpin rule matches. Masquerade marks do
// not change shares.
var explainSource = netip.MustParseAddr("0.0.0.0")

// Views reads what each VIP does from a ruleset (the live kernel's, or a
// rendered one in tests). VIPs are found in steelyard's STEELYARD-SERVICES
// chains; shares come from tracing a new connection from the built-in
// chains the kernel would run, so a missing jump or a deleted endpoint rule
// shows up as a different share rather than being assumed away.
func Views(rs *Ruleset) ([]dataplane.ServiceView, error) {
	type vipKey struct {
		ip    netip.Addr
		port  int
		proto string
	}
	names := map[vipKey]string{}
	svcChains := map[vipKey]Chain{}
	var order []vipKey
	collect := func(t Table, suffix string) {
		ch := rs.Chain(t, ChainServices)
		if ch == nil {
			return
		}
		for _, r := range ch.Rules {
			if r.Dst == nil || !r.Dst.IsSingleIP() || r.DPort == 0 || r.Protocol == "" {
				continue
			}
			k := vipKey{r.Dst.Addr(), r.DPort, r.Protocol}
			if _, ok := names[k]; !ok {
				order = append(order, k)
			}
			names[k] = strings.TrimSuffix(r.Comment, suffix)
			if t == TableNAT && rs.Chain(t, Chain(r.Jump)) != nil {
				svcChains[k] = Chain(r.Jump)
			}
		}
	}
	collect(TableFilter, " has no endpoints")
	collect(TableNAT, "")

	postrouting := map[uint32]bool{}
	views := make([]dataplane.ServiceView, 0, len(order))
	for _, k := range order {
		p := Packet{Src: explainSource, Dst: k.ip, Protocol: k.proto, DPort: k.port}
		v := dataplane.ServiceView{
			Service:  names[k],
			VIP:      k.ip.String(),
			Port:     uint16(k.port),
			Protocol: dataplane.Protocol(strings.ToUpper(k.proto)),
			Backends: []dataplane.BackendView{},
		}
		nat, err := traceIfPresent(rs, TableNAT, "PREROUTING", p)
		if err != nil {
			return nil, fmt.Errorf("explain %s: %w", v.Service, err)
		}
		for _, o := range nat {
			if o.Verdict == "DNAT" && o.Probability > 0 {
				v.Backends = append(v.Backends, dataplane.BackendView{
					IP: o.DNAT.Addr().String(), Port: o.DNAT.Port(), Share: dataplane.RoundShare(100 * o.Probability),
				})
			}
		}
		if c, ok := svcChains[k]; ok && len(v.Backends) > 0 {
			probs, err := checkHairpin(rs, c, p, v.Backends, postrouting)
			if err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			}
			v.Problems = append(v.Problems, probs...)
		}
		if len(v.Backends) == 0 {
			// No DNAT: is a new connection refused on its way through?
			filter, err := traceIfPresent(rs, TableFilter, "FORWARD", p)
			if err != nil {
				return nil, fmt.Errorf("explain %s: %w", v.Service, err)
			}
			for _, o := range filter {
				if o.Verdict == "REJECT" && o.Probability > 0.5 {
					v.Reject = true
				}
			}
		}
		views = append(views, v)
	}
	dataplane.SortViews(views)
	return views, nil
}

func traceIfPresent(rs *Ruleset, t Table, c Chain, p Packet) ([]Outcome, error) {
	if rs.Chain(t, c) == nil {
		return nil, nil
	}
	return rs.Trace(t, c, p)
}

// checkHairpin traces a new connection from each backend to its own VIP,
// starting at the Service chain (not PREROUTING, which would cost a walk
// of every Service per backend), and checks that the connection that lands
// back on the backend leaves POSTROUTING masqueraded: without that, the
// pod would answer itself and the connection would hang.
func checkHairpin(rs *Ruleset, svc Chain, p Packet, backends []dataplane.BackendView, masq map[uint32]bool) ([]string, error) {
	var problems []string
	for _, b := range backends {
		src, err := netip.ParseAddr(b.IP)
		if err != nil {
			return nil, err
		}
		hp := p
		hp.Src = src
		outs, err := rs.Trace(TableNAT, svc, hp)
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
