package iptables

import (
	"net/netip"
	"slices"
)

// Reach answers, for the chains of one table, which DNAT destinations a
// walk from a chain can end at, so a trace that only asks about one
// destination can leave out the chains that cannot lead there.
//
// Why: explain's hairpin check traces a connection from each endpoint to
// its own VIP from the Service chain, and a full trace walks every other
// endpoint's chain too: m^2 endpoint chains per Service, 10^7 walks at
// 1,000 Services x 100 endpoints (BenchmarkExplain1kx100: 97 % of explain's
// CPU, 16 s wall in bench-k8s). With Reach the trace enters only the
// endpoint's own chain.
//
// A Reach caches what it learnt about the ruleset; build a new one after
// the ruleset changes.
type Reach struct {
	rs    *Ruleset
	table Table
	facts map[Chain]*chainFacts
	// jumps finds the facts of a jump's target by the rule's address: a
	// hairpin trace asks about every endpoint chain of its Service once
	// per endpoint, and hashing a pointer is cheaper than a chain name.
	jumps map[*Rule]*chainFacts
}

// chainFacts is what a Reach learnt about one chain.
type chainFacts struct {
	// dnat is the DNAT destinations a walk from the chain can end at.
	dnat reachSet
	// closed caches closes for the packet closedFor (source and mark
	// aside): the traces of one explain share it.
	closedFor  Packet
	closedDone bool
	closed     bool
}

// reachSet is the DNAT destinations a chain can end at; any is true when
// that is not known (a loop, a missing chain, a DNAT we cannot read), and
// then no trace leaves the chain out.
type reachSet struct {
	addrs []netip.Addr
	any   bool
}

// NewReach returns an empty Reach over table t of rs.
func (rs *Ruleset) NewReach(t Table) *Reach {
	return &Reach{rs: rs, table: t, facts: map[Chain]*chainFacts{}, jumps: map[*Rule]*chainFacts{}}
}

// TraceTo is Trace for a caller that only wants the outcomes that DNAT
// to dst: it does not enter a user chain that can neither DNAT to dst nor
// hand any share back to the chain that jumped there (closes), and the
// share that went there is left out of the outcomes. The outcomes that
// DNAT to dst are exactly Trace's, probability and mark included; the
// others may be missing.
func (x *Reach) TraceTo(start Chain, p Packet, dst netip.Addr) ([]Outcome, error) {
	tr := &tracer{rs: x.rs, table: x.table, skip: func(r *Rule, p Packet) bool {
		f, ok := x.jumps[r]
		if !ok {
			f = x.chain(Chain(r.Jump), 0)
			x.jumps[r] = f
		}
		if f.dnat.any || slices.Contains(f.dnat.addrs, dst) {
			return false
		}
		return x.closes(Chain(r.Jump), f, p)
	}}
	terms, rets, err := tr.walk(start, branch{mark: p.Mark, mass: 1}, p, 0)
	if err != nil {
		return nil, err
	}
	for _, b := range rets {
		terms = append(terms, Outcome{Probability: b.mass, Verdict: "ACCEPT", Mark: b.mark})
	}
	return mergeOutcomes(terms), nil
}

// chain returns the facts of chain c, finding its DNAT destinations
// through its jumps the first time.
func (x *Reach) chain(c Chain, depth int) *chainFacts {
	if f, ok := x.facts[c]; ok {
		return f
	}
	ch := x.rs.Chain(x.table, c)
	if ch == nil || depth > maxDepth {
		return &chainFacts{dnat: reachSet{any: true}}
	}
	// A loop finds this placeholder and gives up on the chain.
	f := &chainFacts{dnat: reachSet{any: true}}
	x.facts[c] = f
	var s reachSet
	for _, r := range ch.Rules {
		switch r.Jump {
		case "DNAT":
			to, err := netip.ParseAddrPort(r.TargetArgs["--to-destination"])
			if err != nil {
				s.any = true
			} else if !slices.Contains(s.addrs, to.Addr()) {
				s.addrs = append(s.addrs, to.Addr())
			}
		case "", "RETURN", "ACCEPT", "DROP", "REJECT", "MASQUERADE", "SNAT", "MARK", "LOG", "CT", "CONNMARK", "NOTRACK":
		default:
			sub := x.chain(Chain(r.Jump), depth+1).dnat
			s.any = s.any || sub.any
			for _, a := range sub.addrs {
				if !slices.Contains(s.addrs, a) {
					s.addrs = append(s.addrs, a)
				}
			}
		}
	}
	f.dnat = s
	return f
}

// closes reports whether user chain c ends every walk of p in it, from
// any source and with any mark: a rule that matches every such packet
// with certainty and ends the walk (ACCEPT, DROP, REJECT, DNAT, SNAT,
// MASQUERADE), with no RETURN before it. An endpoint chain closes with
// its DNAT rule.
func (x *Reach) closes(c Chain, f *chainFacts, p Packet) bool {
	p.Src, p.Mark = netip.Addr{}, 0
	if f.closedDone && f.closedFor == p {
		return f.closed
	}
	v := false
	if ch := x.rs.Chain(x.table, c); ch != nil && !BuiltinChain(c) {
		for _, r := range ch.Rules {
			if r.Jump == "RETURN" {
				break
			}
			certain := r.Src == nil && r.MarkMask == 0 && r.Probability == 1 && r.matches(p, 0)
			if certain && slices.Contains([]string{"ACCEPT", "DROP", "REJECT", "DNAT", "SNAT", "MASQUERADE"}, r.Jump) {
				v = true
				break
			}
		}
	}
	f.closedFor, f.closedDone, f.closed = p, true, v
	return v
}
