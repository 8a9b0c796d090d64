package iptables

import (
	iptk "github.com/steelyard-net/steelyard/internal/iptables"

	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
)

// Config is what the iptables dataplane needs to know about the node.
type Config struct {
	// Masquerade says which new connections to a VIP are masqueraded
	// (marked for STEELYARD-POSTROUTING), as in every dataplane.
	dataplane.Masquerade
	// NodeAddresses, when set, is called at each Sync for the addresses
	// node ports are open on (it replaces NodePortAddresses), so an address
	// added to the node later is picked up.
	NodeAddresses func() []netip.Addr
	// NodePortAddresses are the node's addresses on which node ports are
	// open (--nodeport-addresses); addresses of the other family are
	// ignored. None: no node port is reachable.
	NodePortAddresses []netip.Addr
	// Family (4 or 6) is the IP family of the tables written; 0 guesses
	// from the State.
	Family int
	// LocalhostNodePorts opens node ports on 127.0.0.0/8 to the node's own
	// processes, IPv4 only (localhost.go); the caller sets route_localnet.
	LocalhostNodePorts bool
	// NFAcct, with LocalhostNodePorts, counts accepted localhost node port
	// connections in the nfacct object LocalhostCounter; nil: no count.
	// Cleanup deletes through it the per-endpoint objects older releases
	// made.
	NFAcct nfacct.Interface
	// CountConnections is --count-connections. The rules are the same
	// either way: each endpoint's DNAT rule counts its new connections in
	// its own counter, which Counts reads (counts.go).
	CountConnections bool
	// localhostCounter is the nfacct object the rules name: set by the
	// Proxier once it exists.
	localhostCounter string
	// terse: the State is large (terseEndpoints), so the per-endpoint
	// rules go without comments. Set by each render.
	terse bool
}

// terseEndpoints is the number of endpoints above which the per-endpoint
// rules (the split in the Service chains, the rules of the endpoint
// chains) carry no comment, as kube-proxy's "large cluster mode"
// does above the same count. Every comment match is a fixed 256-byte
// xt_comment in the kernel's table, whatever its text, and iptables-legacy
// copies and checks the whole nat table at every restore: at 1,000
// Services x 100 endpoints the 302,000 commented rules made a one-chain
// partial restore cost 2.3-3.1 CPU-s against 1.3-1.5 without per-endpoint
// comments, and iptables-save 1.5 against 1.0 CPU-s
// (docs/data/iptables-1000x100-2026-12-07). The rules of the shared
// chains keep theirs: explain reads them, and Counts names an endpoint's
// Service by following the jumps from them (chainServices).
const terseEndpoints = 1000

// isTerse reports whether s has more than terseEndpoints endpoints.
func isTerse(s dataplane.State) bool {
	n := 0
	for i := range s.Services {
		if n += len(s.Services[i].Backends); n > terseEndpoints {
			return true
		}
	}
	return false
}

// DefaultMasqueradeBit is the fwmark bit used when Config leaves it zero.
const DefaultMasqueradeBit = dataplane.DefaultMasqueradeBit

func (c Config) markMask() string { return c.Mark() }

// Rules is a rendered ruleset: for each table, steelyard's chains in order
// and the rules of each chain (the text after "-A CHAIN ").
type Rules struct {
	tables map[Table]*tableRules
	// frags are the rendered Service ports; a fragment is shared between
	// two renders when its ServicePort did not change, which lets a partial
	// sync skip unchanged Services without comparing their rules.
	frags map[dataplane.ServicePortName]*fragment
	// terse: rendered without per-endpoint comments (terseEndpoints).
	terse bool
}

type tableRules struct {
	order []Chain
	rules map[Chain][]string
}

func newRules() *Rules { return newRulesLike(nil) }

// newRulesLike returns empty Rules with room for as many chains and
// fragments as prev holds (nil: none). A partial sync renders again a
// ruleset about the size of the last one: growing the maps step by step
// (rehashing 101,000 chains at 1,000 Services x 100 endpoints) was half
// of its Go time (BenchmarkSyncPartial1kx100).
func newRulesLike(prev *Rules) *Rules {
	size := func(t Table) (chains int) {
		if prev != nil {
			return len(prev.tables[t].order)
		}
		return 0
	}
	r := &Rules{
		tables: map[Table]*tableRules{},
		frags:  map[dataplane.ServicePortName]*fragment{},
	}
	if prev != nil {
		r.frags = make(map[dataplane.ServicePortName]*fragment, len(prev.frags))
	}
	for _, t := range []Table{TableFilter, TableNAT} {
		n := size(t)
		r.tables[t] = &tableRules{order: make([]Chain, 0, n), rules: make(map[Chain][]string, n)}
	}
	return r
}

// Tables returns the tables in the order they are restored.
func (r *Rules) Tables() []Table { return []Table{TableFilter, TableNAT} }

// Chains returns the chains of table t in render order.
func (r *Rules) Chains(t Table) []Chain { return r.tables[t].order }

// Has reports whether chain c exists in table t.
func (r *Rules) Has(t Table, c Chain) bool {
	_, ok := r.tables[t].rules[c]
	return ok
}

// RulesOf returns the rules of chain c in table t.
func (r *Rules) RulesOf(t Table, c Chain) []string { return r.tables[t].rules[c] }

// Count returns the number of rules in all tables.
func (r *Rules) Count() int {
	n := 0
	for _, t := range r.tables {
		for _, rs := range t.rules {
			n += len(rs)
		}
	}
	return n
}

func (r *Rules) chain(t Table, c Chain) {
	tr := r.tables[t]
	if _, ok := tr.rules[c]; !ok {
		tr.order = append(tr.order, c)
		tr.rules[c] = []string{}
	}
}

func (r *Rules) add(t Table, c Chain, args ...string) {
	r.chain(t, c)
	r.tables[t].rules[c] = append(r.tables[t].rules[c], strings.Join(args, " "))
}

// fragment is the rendering of one Service port: its rules in the shared
// STEELYARD-SERVICES chains and its own chains.
type fragment struct {
	sp     dataplane.ServicePort
	chains []fragmentChain
}

type fragmentChain struct {
	table Table
	chain Chain
	rules []string
}

func (f *fragment) add(t Table, c Chain, args ...string) {
	rule := strings.Join(args, " ")
	for i := len(f.chains) - 1; i >= 0; i-- {
		if f.chains[i].table == t && f.chains[i].chain == c {
			f.chains[i].rules = append(f.chains[i].rules, rule)
			return
		}
	}
	f.chains = append(f.chains, fragmentChain{table: t, chain: c, rules: []string{rule}})
}

// owned returns the chains the fragment owns (not the shared ones).
func (f *fragment) owned() []fragmentChain {
	out := make([]fragmentChain, 0, len(f.chains))
	for _, fc := range f.chains {
		if !sharedChains[fc.chain] {
			out = append(out, fc)
		}
	}
	return out
}

// sharedChains hold rules of many Service ports.
var sharedChains = map[Chain]bool{ChainServices: true, ChainNodePorts: true}

func (r *Rules) merge(f *fragment) {
	for _, fc := range f.chains {
		tr := r.tables[fc.table]
		if sharedChains[fc.chain] {
			tr.rules[fc.chain] = append(tr.rules[fc.chain], fc.rules...)
			continue
		}
		if _, ok := tr.rules[fc.chain]; !ok {
			tr.order = append(tr.order, fc.chain)
		}
		tr.rules[fc.chain] = fc.rules
	}
	r.frags[f.sp.Name] = f
}

// sameServicePort reports whether two Service ports render identically.
func sameServicePort(a, b *dataplane.ServicePort) bool {
	return a.Equal(b)
}

// Render turns a desired State into steelyard's chains. It never touches the
// kernel; Sync decides which chains to write.
func Render(s dataplane.State, cfg Config) *Rules {
	return renderWith(s, cfg, nil, dataplane.FullSync)
}

// renderWith renders s, reusing the fragments of prev for Service ports
// that did not change (the common case of a partial sync: at 10,000
// Services, rendering everything again costs half a second).
func renderWith(s dataplane.State, cfg Config, prev *Rules, req dataplane.SyncRequest) *Rules {
	r := newRulesLike(prev)
	cfg.terse = isTerse(s)
	r.terse = cfg.terse
	if prev != nil && prev.terse != r.terse {
		// The State crossed terseEndpoints: every fragment renders
		// again, with or without its comments.
		prev = nil
	}
	mark := cfg.markMask()
	// The family of the State: node addresses of the other one are left
	// out (a dual-stack node runs one proxier per family).
	family := cfg.Family
	if family == 0 && len(s.Services) > 0 {
		family = s.Services[0].Family()
	}

	// Static chains, always present so the jumps from built-in chains
	// always have a target.
	r.chain(TableFilter, ChainServices)
	r.chain(TableFilter, ChainNodePorts)
	// Only what was DNATed: the reject share of a split (RejectWeight)
	// leaves nat marked for masquerading when the client is off the
	// cluster, but not DNATed; accepted here it was forwarded to the VIP,
	// masqueraded, instead of reaching STEELYARD-SERVICES, which refuses it
	// (this jump runs first in FORWARD). Clients saw no answer, and their
	// SYN retransmitted a second later, unmarked, was refused by a conntrack
	// entry that then sent new connections on the same source port to the
	// refusal too: 52.08 % refused at 1:1 in test/gateway.
	// Forwarded packets conntrack calls INVALID (an out-of-window TCP
	// segment) skip the reverse NAT: a pod behind a VIP would reach its
	// client from its own address and be reset. Dropped as kube-proxy
	// does (kubernetes#74839; the conformance spec "proxy implementation
	// should not be vulnerable to the invalid conntrack state bug").
	r.add(TableFilter, ChainForward, "-m", "comment", "--comment", iptk.Quote("steelyard: drop invalid conntrack state (kubernetes#74839)"),
		"-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	r.add(TableFilter, ChainForward, "-m", "comment", "--comment", iptk.Quote("steelyard: forward masqueraded service traffic"),
		"-m", "mark", "--mark", mark+"/"+mark, "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT")
	r.add(TableFilter, ChainForward, "-m", "comment", "--comment", iptk.Quote("steelyard: forward replies of service traffic"),
		"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	r.chain(TableNAT, ChainServices)
	r.chain(TableNAT, ChainNodePorts)
	renderLocalhost(r, cfg, family)
	r.add(TableNAT, ChainMarkMasq, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	r.add(TableNAT, ChainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	// Clear the bit so a packet that is re-routed is not masqueraded twice.
	r.add(TableNAT, ChainPostrouting, "-j", "MARK", "--set-xmark", mark+"/0x0")
	r.add(TableNAT, ChainPostrouting, "-m", "comment", "--comment", iptk.Quote("steelyard: masquerade hairpin and off-cluster traffic"),
		"-j", "MASQUERADE", "--random-fully")

	for i := range s.Services {
		sp := &s.Services[i]
		if prev != nil {
			// A port whose Service the tracker saw unchanged keeps its
			// fragment without a comparison; the others are compared,
			// since a change of one port of a Service leaves the
			// others' rules as they were.
			if f, ok := prev.frags[sp.Name]; ok && (!req.MayHaveChanged(sp.Name) || sameServicePort(&f.sp, sp)) {
				r.merge(f)
				continue
			}
		}
		f := &fragment{sp: *sp}
		f.sp.Backends = slices.Clone(sp.Backends)
		f.sp.ExternalIPs = slices.Clone(sp.ExternalIPs)
		f.sp.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
		f.sp.SourceRanges = slices.Clone(sp.SourceRanges)
		renderService(f, sp, cfg)
		r.merge(f)
	}
	// Node ports last, as kube-proxy does: a VIP rule wins over a node
	// address that happens to match.
	for _, ip := range cfg.NodePortAddresses {
		if family != 0 && ip.Is4() != (family == 4) {
			continue
		}
		for _, t := range []Table{TableNAT, TableFilter} {
			r.add(t, ChainServices, "-d", hostPrefix(ip), "-m", "comment", "--comment", iptk.Quote("steelyard: node ports"), "-j", string(ChainNodePorts))
		}
	}
	renderLocalhostJumps(r, cfg, family)
	return r
}

// Comment suffixes name the entry point of a rule in the shared chains;
// explain reads them back.
const (
	suffixExternalIP   = " external IP"
	suffixLoadBalancer = " loadbalancer IP"
	suffixNodePort     = " node port"
	// Filter rules: why a new connection is refused or dropped.
	suffixNoEndpoints      = " has no endpoints"
	suffixNoLocalEndpoints = " has no local endpoints"
	suffixSourceNotAllowed = " source not allowed"
	// suffixRejectShare: the reject share of a split (RejectWeight) leaves
	// the nat chains without DNAT and is refused here.
	suffixRejectShare = " reject share"
)

// entryMatch is one way into a Service port: the matches of its rule in a
// shared chain, and the comment suffix naming it.
type entryMatch struct {
	chain  Chain // ChainServices or ChainNodePorts
	args   []string
	suffix string
}

func renderService(r *fragment, sp *dataplane.ServicePort, cfg Config) {
	name := commentName(sp.Name)
	proto := sp.VIP.Protocol.Lower()
	dst := hostPrefix(sp.VIP.IP)
	dport := strconv.Itoa(int(sp.VIP.Port))
	// The external entry points, in rule order.
	var external []entryMatch
	if sp.NodePort != 0 {
		external = append(external, entryMatch{ChainNodePorts, []string{"-p", proto}, suffixNodePort})
	}
	for _, ip := range sp.ExternalIPs {
		external = append(external, entryMatch{ChainServices, []string{"-d", hostPrefix(ip), "-p", proto}, suffixExternalIP})
	}
	for _, ip := range sp.LoadBalancerIPs {
		external = append(external, entryMatch{ChainServices, []string{"-d", hostPrefix(ip), "-p", proto}, suffixLoadBalancer})
	}
	portOf := func(e entryMatch) string {
		if e.chain == ChainNodePorts {
			return strconv.Itoa(int(sp.NodePort))
		}
		return dport
	}
	// filterRule refuses (REJECT) or drops new connections through an entry
	// point that nothing DNATed. The filter table sees forwarded (FORWARD),
	// local (INPUT: node ports) and locally originated (OUTPUT) connections.
	filterRule := func(e entryMatch, why, verdict string) {
		args := append(slices.Clone(e.args), "-m", "comment", "--comment", iptk.Quote(name+e.suffix+why), "-m", proto, "--dport", portOf(e))
		switch {
		case verdict == "REJECT" && why == suffixRejectShare && sp.VIP.Protocol == dataplane.TCP:
			// A reset: the ICMP errors of a share of every connection
			// would hit the kernel's ICMP rate limit (one a second per
			// client by default) and leave most clients waiting.
			args = append(args, "-j", "REJECT", "--reject-with", "tcp-reset")
		case verdict == "REJECT":
			args = append(args, "-j", "REJECT", "--reject-with", rejectWith(sp.VIP.IP))
		default:
			args = append(args, "-j", "DROP")
		}
		r.add(TableFilter, e.chain, args...)
	}
	internal := entryMatch{ChainServices, []string{"-d", dst, "-p", proto}, ""}

	active := sp.Active()
	if len(active) == 0 {
		// Refuse at once instead of letting the client time out.
		filterRule(internal, suffixNoEndpoints, "REJECT")
		for _, e := range external {
			filterRule(e, suffixNoEndpoints, "REJECT")
		}
		return
	}

	cluster := sp.ClusterBackends()
	if len(cluster) == 0 {
		// The controller never leaves topology with nothing; be safe.
		cluster = active
	}
	local := sp.LocalBackends()
	if sp.RejectWeight > 0 {
		// The reject share RETURNs from the split without DNAT: it reaches
		// the filter table still aimed at the entry point, which nothing
		// DNATed does. Entry points that drop what is not DNATed (Local
		// policy without a local endpoint, source ranges) drop it there.
		if !sp.InternalLocal || len(local) > 0 {
			filterRule(internal, suffixRejectShare, "REJECT")
		}
		for _, e := range external {
			if (!sp.ExternalLocal || len(local) > 0) && (e.suffix != suffixLoadBalancer || len(sp.SourceRanges) == 0) {
				filterRule(e, suffixRejectShare, "REJECT")
			}
		}
	}
	svc := ServiceChain(sp.Name, sp.VIP.Protocol)
	svl := LocalChain(sp.Name, sp.VIP.Protocol)
	ext := ExternalChain(sp.Name, sp.VIP.Protocol)
	usesSVC := !sp.InternalLocal || len(external) > 0
	usesSVL := (sp.InternalLocal || (len(external) > 0 && sp.ExternalLocal)) && len(local) > 0

	// Internal traffic: the clusterIP.
	switch {
	case !sp.InternalLocal:
		r.add(TableNAT, ChainServices, "-d", dst, "-p", proto, "-m", "comment", "--comment", iptk.Quote(name),
			"-m", proto, "--dport", dport, "-j", string(svc))
	case len(local) > 0:
		r.add(TableNAT, ChainServices, "-d", dst, "-p", proto, "-m", "comment", "--comment", iptk.Quote(name),
			"-m", proto, "--dport", dport, "-j", string(svl))
	default:
		// internalTrafficPolicy Local without a local endpoint: drop, as
		// kube-proxy does.
		filterRule(internal, suffixNoLocalEndpoints, "DROP")
	}

	// External traffic: node port, external IPs, load-balancer IPs.
	if len(external) > 0 {
		fw := FirewallChain(sp.Name, sp.VIP.Protocol)
		for _, e := range external {
			target := ext
			if e.suffix == suffixLoadBalancer && len(sp.SourceRanges) > 0 {
				target = fw
			}
			args := append(slices.Clone(e.args), "-m", "comment", "--comment", iptk.Quote(name+e.suffix), "-m", proto, "--dport", portOf(e), "-j", string(target))
			r.add(TableNAT, e.chain, args...)
		}
		if len(sp.LoadBalancerIPs) > 0 && len(sp.SourceRanges) > 0 {
			// Allowed sources go on; the others reach the filter table
			// still aimed at the load-balancer IP and are dropped there.
			for _, src := range sp.SourceRanges {
				r.add(TableNAT, fw, "-s", src.String(), "-m", "comment", "--comment", iptk.Quote(name+" loadBalancerSourceRanges"), "-j", string(ext))
			}
		}
		if !sp.ExternalLocal {
			// Cluster policy: the endpoint may be on another node, so the
			// reply must come back through this one (kube-proxy does the same).
			r.add(TableNAT, ext, "-m", "comment", "--comment", iptk.Quote("masquerade traffic for "+name+" external destinations"), "-j", string(ChainMarkMasq))
			r.add(TableNAT, ext, "-j", string(svc))
		} else {
			// Local policy: pods and the node itself still reach every
			// endpoint (the node masqueraded); others keep their source
			// address and reach only this node's endpoints.
			for _, c := range cfg.CIDRs(sp.Family()) {
				r.add(TableNAT, ext, "-s", c.String(), "-m", "comment", "--comment", iptk.Quote("pod traffic for "+name+" external destinations"), "-j", string(svc))
			}
			r.add(TableNAT, ext, "-m", "comment", "--comment", iptk.Quote("masquerade LOCAL traffic for "+name+" external destinations"),
				"-m", "addrtype", "--src-type", "LOCAL", "-j", string(ChainMarkMasq))
			r.add(TableNAT, ext, "-m", "comment", "--comment", iptk.Quote("route LOCAL traffic for "+name+" external destinations"),
				"-m", "addrtype", "--src-type", "LOCAL", "-j", string(svc))
			if len(local) > 0 {
				r.add(TableNAT, ext, "-j", string(svl))
			}
		}
		for _, e := range external {
			switch {
			case sp.ExternalLocal && len(local) == 0:
				filterRule(e, suffixNoLocalEndpoints, "DROP")
			case e.suffix == suffixLoadBalancer && len(sp.SourceRanges) > 0:
				filterRule(e, suffixSourceNotAllowed, "DROP")
			}
		}
	}

	if usesSVC {
		// Off-cluster clients of the clusterIP are masqueraded so the reply
		// comes back through this node and is un-DNATed.
		vipMatch := []string{"-d", dst, "-p", proto}
		switch cidrs := cfg.CIDRs(sp.Family()); {
		case cfg.MasqueradeAll:
			r.add(TableNAT, svc, append(vipMatch, "-m", "comment", "--comment", iptk.Quote(name+" masquerade"),
				"-m", proto, "--dport", dport, "-j", string(ChainMarkMasq))...)
		case len(cidrs) == 1:
			r.add(TableNAT, svc, append([]string{"!", "-s", cidrs[0].String()}, append(vipMatch, "-m", "comment", "--comment", iptk.Quote(name+" off-cluster"),
				"-m", proto, "--dport", dport, "-j", string(ChainMarkMasq))...)...)
		case len(cidrs) > 1:
			// "Not in any of these ranges": mark, then clear the mark for
			// each cluster range. Both match the VIP only, so a mark set
			// by the external chain stays.
			r.add(TableNAT, svc, append(slices.Clone(vipMatch), "-m", "comment", "--comment", iptk.Quote(name+" off-cluster"),
				"-m", proto, "--dport", dport, "-j", string(ChainMarkMasq))...)
			for _, c := range cidrs {
				r.add(TableNAT, svc, append([]string{"-s", c.String()}, append(slices.Clone(vipMatch), "-m", "comment", "--comment", iptk.Quote(name+" in-cluster"),
					"-m", proto, "--dport", dport, "-j", "MARK", "--set-xmark", "0x0/"+cfg.markMask())...)...)
			}
		}
		renderSplit(r, svc, sp, cluster, cfg.terse)
	}
	if usesSVL {
		renderSplit(r, svl, sp, local, cfg.terse)
	}
	var used [][]dataplane.Backend
	if usesSVC {
		used = append(used, cluster)
	}
	if usesSVL {
		used = append(used, local)
	}
	seps := map[Chain]bool{}
	for _, list := range used {
		for _, b := range list {
			sep := EndpointChain(sp.Name, sp.VIP.Protocol, b)
			if seps[sep] {
				continue
			}
			seps[sep] = true
			// Hairpin: a pod reaching itself through the VIP must see the node
			// as the source, or its reply would never be un-DNATed.
			if cfg.terse {
				r.add(TableNAT, sep, "-s", hostPrefix(b.IP), "-j", string(ChainMarkMasq))
			} else {
				r.add(TableNAT, sep, "-s", hostPrefix(b.IP), "-m", "comment", "--comment", iptk.Quote(name+" hairpin"), "-j", string(ChainMarkMasq))
			}
			dnat := []string{"-p", proto}
			if !cfg.terse {
				dnat = append(dnat, "-m", "comment", "--comment", iptk.Quote(name))
			}
			if sp.AffinitySeconds > 0 {
				dnat = append(dnat, "-m", "recent", "--set", "--name", string(sep), "--mask", fullMask(b.IP), "--rsource")
			}
			r.add(TableNAT, sep, append(dnat, "-m", proto, "-j", "DNAT", "--to-destination", b.Addr().String())...)
		}
	}
}

// renderSplit writes the rules of a Service or local chain that split new
// connections across bs by weight; with session affinity, a client seen
// within the timeout first goes back to the endpoint it had. terse leaves
// out the per-endpoint comments (terseEndpoints).
func renderSplit(r *fragment, chain Chain, sp *dataplane.ServicePort, bs []dataplane.Backend, terse bool) {
	name := commentName(sp.Name)
	// comment returns the comment match of a per-endpoint rule.
	comment := func(text func() string) []string {
		if terse {
			return nil
		}
		return []string{"-m", "comment", "--comment", iptk.Quote(text())}
	}
	if sp.AffinitySeconds > 0 {
		for _, b := range bs {
			sep := EndpointChain(sp.Name, sp.VIP.Protocol, b)
			r.add(TableNAT, chain, append(comment(func() string { return fmt.Sprintf("%s -> %s affinity", name, b.Addr()) }),
				"-m", "recent", "--rcheck", "--seconds", strconv.Itoa(sp.AffinitySeconds), "--reap", "--name", string(sep),
				"--mask", fullMask(b.IP), "--rsource", "-j", string(sep))...)
		}
	}
	if rej := sp.RejectShare(bs); rej > 0 {
		r.add(TableNAT, chain, "-m", "comment", "--comment", iptk.Quote(fmt.Sprintf("%s reject weight %s", name, formatWeight(sp.RejectWeight))),
			"-m", "statistic", "--mode", "random", "--probability", FormatProbability(rej), "-j", "RETURN")
	}
	weights := make([]float64, len(bs))
	for i, b := range bs {
		weights[i] = b.Weight
	}
	probs := Probabilities(weights)
	for i, b := range bs {
		sep := EndpointChain(sp.Name, sp.VIP.Protocol, b)
		args := comment(func() string { return fmt.Sprintf("%s -> %s weight %s", name, b.Addr(), formatWeight(b.Weight)) })
		if i < len(bs)-1 {
			args = append(args, "-m", "statistic", "--mode", "random", "--probability", FormatProbability(probs[i]))
		}
		r.add(TableNAT, chain, append(args, "-j", string(sep))...)
	}
}

// rejectWith is the ICMP error of a refused connection in ip's family.
func rejectWith(ip netip.Addr) string {
	if ip.Is4() {
		return "icmp-port-unreachable"
	}
	return "icmp6-port-unreachable"
}

// fullMask is the recent match's --mask for one client address, written the
// way iptables-save prints it.
func fullMask(ip netip.Addr) string {
	if ip.Is4() {
		return "255.255.255.255"
	}
	return "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
}

func hostPrefix(ip netip.Addr) string {
	return netip.PrefixFrom(ip, ip.BitLen()).String()
}

// commentName is a Service port's name as rule comments carry it: its
// ShortName within XtCommentMax less the longest text around it (an IPv6
// endpoint and its weight, "masquerade LOCAL traffic for ... external
// destinations"), so no comment reaches the limit and iptables-restore
// never refuses a sync for a long name.
func commentName(n dataplane.ServicePortName) string {
	return dataplane.ShortName(n.String(), dataplane.XtCommentMax-96)
}

func formatWeight(w float64) string {
	return strconv.FormatFloat(w, 'g', 6, 64)
}

// restoreText renders the iptables-restore --noflush input that writes the
// chains in write (every rule of each is replaced: declaring ":CHAIN - [0:0]"
// flushes exactly that chain) and deletes the chains in remove.
func restoreText(r *Rules, write, remove map[Table][]Chain) []byte {
	// Size the buffer first: at 10,000 Services the text is tens of MB and
	// growing it step by step dominated the render time.
	size := 0
	for _, t := range r.Tables() {
		size += 32
		for _, c := range write[t] {
			size += 2*len(c) + 16
			for _, rule := range r.RulesOf(t, c) {
				size += len(c) + len(rule) + 5
			}
		}
		size += len(remove[t]) * 64
	}
	b := make([]byte, 0, size)
	for _, t := range r.Tables() {
		if len(write[t]) == 0 && len(remove[t]) == 0 {
			continue
		}
		b = append(b, '*')
		b = append(b, t...)
		b = append(b, '\n')
		for _, cs := range [][]Chain{write[t], remove[t]} {
			for _, c := range cs {
				b = append(b, ':')
				b = append(b, c...)
				b = append(b, " - [0:0]\n"...)
			}
		}
		for _, c := range write[t] {
			for _, rule := range r.RulesOf(t, c) {
				b = append(b, "-A "...)
				b = append(b, c...)
				b = append(b, ' ')
				b = append(b, rule...)
				b = append(b, '\n')
			}
		}
		for _, c := range remove[t] {
			b = append(b, "-X "...)
			b = append(b, c...)
			b = append(b, '\n')
		}
		b = append(b, "COMMIT\n"...)
	}
	return b
}

// FullRestore returns the restore text that writes every chain of r; tests
// and the benchmark use it to show the whole ruleset.
func FullRestore(r *Rules) []byte {
	write := map[Table][]Chain{}
	for _, t := range r.Tables() {
		write[t] = append([]Chain(nil), r.Chains(t)...)
	}
	return restoreText(r, write, nil)
}

func sortedChains(cs []Chain) []Chain {
	sort.Slice(cs, func(i, j int) bool { return cs[i] < cs[j] })
	return cs
}
