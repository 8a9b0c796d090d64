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
		}
	}
	collect(TableFilter, " has no endpoints")
	collect(TableNAT, "")

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
