package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
)

// Packet is the first packet of a new connection, as the tracer sees it.
type Packet struct {
	Src, Dst netip.Addr
	Protocol string // "tcp", "udp" or "sctp", as -p spells it
	DPort    int
	Mark     uint32
	// SrcLocal and DstLocal tell whether the source and destination are
	// addresses of the node itself (-m addrtype ... LOCAL).
	SrcLocal, DstLocal bool
}

// TraceInfo is what a trace saw besides outcomes.
type TraceInfo struct {
	// AffinitySeconds is the largest --seconds of the session-affinity
	// checks (-m recent --rcheck) the walk passed: a client seen within it
	// would have gone back to its previous endpoint. A traced packet is a
	// new client's, so it never matches them.
	AffinitySeconds int
}

// Outcome is where a share of new connections ends up.
type Outcome struct {
	// Probability is the share of new connections (0..1) with this outcome.
	Probability float64
	// Verdict is the terminating target: DNAT, MASQUERADE, SNAT, ACCEPT
	// (also a built-in chain's policy), DROP or REJECT.
	Verdict string
	// DNAT is the destination after DNAT, if Verdict is DNAT.
	DNAT netip.AddrPort
	// Mark is the packet mark at the end (masquerade bit included).
	Mark uint32
}

// maxDepth bounds jumps so a loop in a hand-edited ruleset cannot hang us.
const maxDepth = 32

// Trace walks table t from chain start for packet p and returns every
// outcome with its probability. Statistic matches split the walk, so the
// result is the exact share of new connections per outcome, computed from
// the probabilities written in the rules. Outcomes with the same verdict,
// destination and mark are merged.
func (rs *Ruleset) Trace(t Table, start Chain, p Packet) ([]Outcome, error) {
	outs, _, err := rs.TraceInfo(t, start, p)
	return outs, err
}

// TraceInfo is Trace that also reports what the walk saw on its way.
func (rs *Ruleset) TraceInfo(t Table, start Chain, p Packet) ([]Outcome, TraceInfo, error) {
	tr := &tracer{rs: rs, table: t}
	terms, rets, err := tr.walk(start, branch{mark: p.Mark, mass: 1}, p, 0)
	if err != nil {
		return nil, TraceInfo{}, err
	}
	for _, b := range rets {
		// Falling off a user chain used as the start is like ACCEPT.
		terms = append(terms, Outcome{Probability: b.mass, Verdict: "ACCEPT", Mark: b.mark})
	}
	return mergeOutcomes(terms), tr.info, nil
}

type tracer struct {
	rs    *Ruleset
	table Table
	info  TraceInfo
	// skip, when set, tells which user chains a jump does not enter: the
	// share that jumps there ends without an outcome (Reach.TraceTo).
	skip func(r *Rule, p Packet) bool
}

// branch is a share of the walk that is still going: the mark so far and
// the probability mass.
type branch struct {
	mark uint32
	mass float64
}

func (tr *tracer) walk(c Chain, in branch, p Packet, depth int) (terms []Outcome, returns []branch, err error) {
	if depth > maxDepth {
		return nil, nil, fmt.Errorf("trace: jumps nested deeper than %d at %s", maxDepth, c)
	}
	ch := tr.rs.Chain(tr.table, c)
	if ch == nil {
		return nil, nil, fmt.Errorf("trace: chain %s missing from table %s", c, tr.table)
	}
	// cur and spare swap at each rule that splits the walk, so a long
	// chain allocates two slices instead of one per rule.
	cur, spare := []branch{in}, []branch(nil)
	for _, r := range ch.Rules {
		if r.Recent != nil && r.Recent.Check && len(r.Unknown) == 0 && slices.ContainsFunc(cur, func(b branch) bool { return b.mass > 0 }) {
			tr.info.AffinitySeconds = max(tr.info.AffinitySeconds, r.Recent.Seconds)
		}
		// Fast path: most rules match no branch (a VIP walking the long
		// STEELYARD-SERVICES chain); keep cur as it is.
		if !slices.ContainsFunc(cur, func(b branch) bool { return b.mass > 0 && r.matches(p, b.mark) }) {
			continue
		}
		next := spare[:0]
		for _, b := range cur {
			if b.mass == 0 {
				continue
			}
			if !r.matches(p, b.mark) {
				next = append(next, b)
				continue
			}
			hit := branch{mark: b.mark, mass: b.mass * r.Probability}
			if miss := b.mass - hit.mass; miss > 0 {
				next = append(next, branch{mark: b.mark, mass: miss})
			}
			t, cont, err := tr.target(r, hit, p, depth)
			if err != nil {
				return nil, nil, err
			}
			terms = append(terms, t...)
			for _, x := range cont {
				if x.returned {
					returns = append(returns, x.branch)
				} else {
					next = append(next, x.branch)
				}
			}
		}
		cur, spare = mergeBranches(next), cur
	}
	if BuiltinChain(c) {
		for _, b := range cur {
			terms = append(terms, Outcome{Probability: b.mass, Verdict: ch.Policy, Mark: b.mark})
		}
		return terms, nil, nil
	}
	return terms, append(returns, cur...), nil
}

type continuation struct {
	branch
	// returned is true when a RETURN ends the current chain.
	returned bool
}

func (tr *tracer) target(r *Rule, b branch, p Packet, depth int) ([]Outcome, []continuation, error) {
	switch r.Jump {
	case "":
		return nil, []continuation{{branch: b}}, nil
	case "RETURN":
		return nil, []continuation{{branch: b, returned: true}}, nil
	case "ACCEPT", "DROP", "REJECT", "MASQUERADE", "SNAT":
		return []Outcome{{Probability: b.mass, Verdict: r.Jump, Mark: b.mark}}, nil, nil
	case "DNAT":
		to, err := netip.ParseAddrPort(r.TargetArgs["--to-destination"])
		if err != nil {
			return nil, nil, fmt.Errorf("trace: DNAT %q: %w", r.TargetArgs["--to-destination"], err)
		}
		return []Outcome{{Probability: b.mass, Verdict: "DNAT", DNAT: to, Mark: b.mark}}, nil, nil
	case "MARK":
		val, mask, err := ParseMark(r.TargetArgs["--set-xmark"])
		if err != nil {
			return nil, nil, fmt.Errorf("trace: MARK: %w", err)
		}
		b.mark = (b.mark &^ mask) ^ val
		return nil, []continuation{{branch: b}}, nil
	case "LOG", "CT", "CONNMARK", "NOTRACK":
		return nil, []continuation{{branch: b}}, nil
	}
	if tr.skip != nil && tr.skip(r, p) {
		return nil, nil, nil
	}
	terms, rets, err := tr.walk(Chain(r.Jump), b, p, depth+1)
	if err != nil {
		return nil, nil, err
	}
	conts := make([]continuation, 0, len(rets))
	for _, x := range rets {
		conts = append(conts, continuation{branch: x})
	}
	return terms, conts, nil
}

func (r *Rule) matches(p Packet, mark uint32) bool {
	if len(r.Unknown) > 0 {
		return false
	}
	if r.Src != nil && r.Src.Contains(p.Src) == r.NotSrc {
		return false
	}
	if r.Dst != nil && r.Dst.Contains(p.Dst) == r.NotDst {
		return false
	}
	if r.Protocol != "" && r.Protocol != "all" && r.Protocol != p.Protocol {
		return false
	}
	if r.DPort != 0 && r.DPort != p.DPort {
		return false
	}
	if r.MarkMask != 0 && (mark&r.MarkMask == r.MarkValue) == r.NotMark {
		return false
	}
	if (r.SrcLocal != 0 && (r.SrcLocal > 0) != p.SrcLocal) || (r.DstLocal != 0 && (r.DstLocal > 0) != p.DstLocal) {
		return false
	}
	// A new client is in no affinity list: --rcheck never matches it, and
	// --set always matches.
	if r.Recent != nil && r.Recent.Check {
		return false
	}
	// A traced packet is the first of a new connection (and, traced from
	// the start of a table, not DNATed yet).
	if len(r.CTStates) > 0 && slices.Contains(r.CTStates, "NEW") == r.NotCTStates {
		return false
	}
	return true
}

// mergeBranches adds up the branches with the same mark, in the order
// the marks first appear. A walk carries one or two marks, so up to 8
// branches merge in place, without a map.
func mergeBranches(bs []branch) []branch {
	if len(bs) < 2 {
		return bs
	}
	if len(bs) <= 8 {
		out := bs[:0]
	next:
		for _, b := range bs {
			for j := range out {
				if out[j].mark == b.mark {
					out[j].mass += b.mass
					continue next
				}
			}
			out = append(out, b)
		}
		return out
	}
	byMark := map[uint32]float64{}
	var order []uint32
	for _, b := range bs {
		if _, ok := byMark[b.mark]; !ok {
			order = append(order, b.mark)
		}
		byMark[b.mark] += b.mass
	}
	out := make([]branch, 0, len(order))
	for _, m := range order {
		out = append(out, branch{mark: m, mass: byMark[m]})
	}
	return out
}

func mergeOutcomes(os []Outcome) []Outcome {
	type key struct {
		verdict string
		dnat    netip.AddrPort
		mark    uint32
	}
	sum := map[key]float64{}
	for _, o := range os {
		sum[key{o.Verdict, o.DNAT, o.Mark}] += o.Probability
	}
	out := make([]Outcome, 0, len(sum))
	for k, v := range sum {
		out = append(out, Outcome{Probability: v, Verdict: k.verdict, DNAT: k.dnat, Mark: k.mark})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Verdict != b.Verdict {
			return a.Verdict < b.Verdict
		}
		if a.DNAT != b.DNAT {
			return a.DNAT.Compare(b.DNAT) < 0
		}
		return a.Mark < b.Mark
	})
	return out
}
