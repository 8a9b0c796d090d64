package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Config is what the iptables dataplane needs to know about the node.
type Config struct {
	// ClusterCIDRs are the pod ranges. New connections to a VIP from outside
	// them are masqueraded, so replies return through this node.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades every new connection to a VIP.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit that asks STEELYARD-POSTROUTING to
	// masquerade; 13 (0x2000) by default, away from kube-proxy's 14 and 15.
	MasqueradeBit int
}

// DefaultMasqueradeBit is the fwmark bit used when Config leaves it zero.
const DefaultMasqueradeBit = 13

func (c Config) markMask() string {
	bit := c.MasqueradeBit
	if bit == 0 {
		bit = DefaultMasqueradeBit
	}
	return fmt.Sprintf("0x%x", uint32(1)<<bit)
}

// Rules is a rendered ruleset: for each table, steelyard's chains in order
// and the rules of each chain (the text after "-A CHAIN ").
type Rules struct {
	tables map[Table]*tableRules
	// frags are the rendered Service ports; a fragment is shared between
	// two renders when its ServicePort did not change, which lets a partial
	// sync skip unchanged Services without comparing their rules.
	frags map[dataplane.ServicePortName]*fragment
}

type tableRules struct {
	order []Chain
	rules map[Chain][]string
}

func newRules() *Rules {
	return &Rules{
		tables: map[Table]*tableRules{
			TableFilter: {rules: map[Chain][]string{}},
			TableNAT:    {rules: map[Chain][]string{}},
		},
		frags: map[dataplane.ServicePortName]*fragment{},
	}
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
		if fc.chain != ChainServices {
			out = append(out, fc)
		}
	}
	return out
}

func (r *Rules) merge(f *fragment) {
	for _, fc := range f.chains {
		tr := r.tables[fc.table]
		if fc.chain == ChainServices {
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
	return a.Name == b.Name && a.VIP == b.VIP && slices.Equal(a.Backends, b.Backends)
}

// Render turns a desired State into steelyard's chains. It never touches the
// kernel; Sync decides which chains to write.
func Render(s dataplane.State, cfg Config) *Rules {
	return renderWith(s, cfg, nil)
}

// renderWith renders s, reusing the fragments of prev for Service ports
// that did not change (the common case of a partial sync: at 10,000
// Services, rendering everything again costs half a second).
func renderWith(s dataplane.State, cfg Config, prev *Rules) *Rules {
	r := newRules()
	mark := cfg.markMask()

	// Static chains, always present so the jumps from built-in chains
	// always have a target.
	r.chain(TableFilter, ChainServices)
	r.add(TableFilter, ChainForward, "-m", "comment", "--comment", quote("steelyard: forward masqueraded service traffic"),
		"-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	r.add(TableFilter, ChainForward, "-m", "comment", "--comment", quote("steelyard: forward replies of service traffic"),
		"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	r.chain(TableNAT, ChainServices)
	r.add(TableNAT, ChainMarkMasq, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	r.add(TableNAT, ChainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	// Clear the bit so a packet that is re-routed is not masqueraded twice.
	r.add(TableNAT, ChainPostrouting, "-j", "MARK", "--set-xmark", mark+"/0x0")
	r.add(TableNAT, ChainPostrouting, "-m", "comment", "--comment", quote("steelyard: masquerade hairpin and off-cluster traffic"),
		"-j", "MASQUERADE", "--random-fully")

	for i := range s.Services {
		sp := &s.Services[i]
		if prev != nil {
			if f, ok := prev.frags[sp.Name]; ok && sameServicePort(&f.sp, sp) {
				r.merge(f)
				continue
			}
		}
		f := &fragment{sp: *sp}
		f.sp.Backends = slices.Clone(sp.Backends)
		renderService(f, sp, cfg)
		r.merge(f)
	}
	return r
}

func renderService(r *fragment, sp *dataplane.ServicePort, cfg Config) {
	name := sp.Name.String()
	proto := sp.VIP.Protocol.Lower()
	dst := hostPrefix(sp.VIP.IP)
	dport := strconv.Itoa(int(sp.VIP.Port))
	active := sp.Active()

	if len(active) == 0 {
		// Refuse at once instead of letting the client time out. The filter
		// table sees forwarded (FORWARD) and local (OUTPUT) connections.
		r.add(TableFilter, ChainServices, "-d", dst, "-p", proto, "-m", "comment", "--comment", quote(name+" has no endpoints"),
			"-m", proto, "--dport", dport, "-j", "REJECT", "--reject-with", "icmp-port-unreachable")
		return
	}

	svc := ServiceChain(sp.Name, sp.VIP.Protocol)
	r.add(TableNAT, ChainServices, "-d", dst, "-p", proto, "-m", "comment", "--comment", quote(name),
		"-m", proto, "--dport", dport, "-j", string(svc))

	// Off-cluster clients are masqueraded so the reply comes back through
	// this node and is un-DNATed.
	switch {
	case cfg.MasqueradeAll:
		r.add(TableNAT, svc, "-d", dst, "-p", proto, "-m", "comment", "--comment", quote(name+" masquerade"),
			"-m", proto, "--dport", dport, "-j", string(ChainMarkMasq))
	case len(cfg.ClusterCIDRs) == 1:
		r.add(TableNAT, svc, "!", "-s", cfg.ClusterCIDRs[0].String(), "-d", dst, "-p", proto, "-m", "comment", "--comment", quote(name+" off-cluster"),
			"-m", proto, "--dport", dport, "-j", string(ChainMarkMasq))
	case len(cfg.ClusterCIDRs) > 1:
		// "not in any of these ranges": RETURN-free form with one rule per
		// range would OR them; use a sub-chain-free trick instead: mark, then
		// clear the mark for each cluster range.
		r.add(TableNAT, svc, "-m", "comment", "--comment", quote(name+" off-cluster"), "-j", string(ChainMarkMasq))
		for _, c := range cfg.ClusterCIDRs {
			r.add(TableNAT, svc, "-s", c.String(), "-m", "comment", "--comment", quote(name+" in-cluster"),
				"-j", "MARK", "--set-xmark", "0x0/"+cfg.markMask())
		}
	}

	weights := make([]float64, len(active))
	for i, b := range active {
		weights[i] = b.Weight
	}
	probs := Probabilities(weights)
	for i, b := range active {
		sep := EndpointChain(sp.Name, sp.VIP.Protocol, b)
		comment := quote(fmt.Sprintf("%s -> %s weight %s", name, b.Addr(), formatWeight(b.Weight)))
		if i < len(active)-1 {
			r.add(TableNAT, svc, "-m", "comment", "--comment", comment,
				"-m", "statistic", "--mode", "random", "--probability", FormatProbability(probs[i]), "-j", string(sep))
		} else {
			r.add(TableNAT, svc, "-m", "comment", "--comment", comment, "-j", string(sep))
		}
		// Hairpin: a pod reaching itself through the VIP must see the node
		// as the source, or its reply would never be un-DNATed.
		r.add(TableNAT, sep, "-s", hostPrefix(b.IP), "-m", "comment", "--comment", quote(name+" hairpin"), "-j", string(ChainMarkMasq))
		r.add(TableNAT, sep, "-p", proto, "-m", "comment", "--comment", quote(name), "-m", proto,
			"-j", "DNAT", "--to-destination", b.Addr().String())
	}
}

func hostPrefix(ip netip.Addr) string {
	return netip.PrefixFrom(ip, ip.BitLen()).String()
}

func formatWeight(w float64) string {
	return strconv.FormatFloat(w, 'g', 6, 64)
}

// quote quotes a comment the way iptables-save does.
func quote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
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
