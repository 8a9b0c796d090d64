package ipvs

import (
	"fmt"
	"strings"

	"github.com/steelyard-net/steelyard/internal/iptables"
)

// The iptables chains of the IPVS dataplane. They hold a fixed handful of
// rules whatever the number of Services: the entry points and destinations
// they match are members of the ipsets (sets.go). They do not start with
// "STEELYARD-": the iptables mode owns that prefix and deletes the chains
// under it that it did not write, which would fail (and keep failing) while
// a jump to one of these exists, after a switch of mode without cleanup.
const (
	// ChainServices (nat) marks new connections for masquerading.
	ChainServices iptables.Chain = "IPVS-STEELYARD-SERVICES"
	// ChainPostrouting (nat) masquerades what was marked, and hairpins.
	ChainPostrouting iptables.Chain = "IPVS-STEELYARD-POSTROUTING"
	// ChainFilter (filter, from INPUT) drops new connections that a Local
	// policy without local endpoint or loadBalancerSourceRanges refuse. The
	// filter table's INPUT hook runs before IPVS's (priority 0 < 98), so
	// the packet is dropped before IPVS schedules it.
	ChainFilter iptables.Chain = "IPVS-STEELYARD-FILTER"
)

type ipvsJump struct {
	table iptables.Table
	from  iptables.Chain
	to    iptables.Chain
	note  string
	// match goes before the comment ("-m conntrack --ctstate NEW").
	match []string
}

var ipvsJumps = []ipvsJump{
	{iptables.TableNAT, "PREROUTING", ChainServices, "steelyard ipvs services", nil},
	{iptables.TableNAT, "OUTPUT", ChainServices, "steelyard ipvs services", nil},
	{iptables.TableNAT, "POSTROUTING", ChainPostrouting, "steelyard ipvs postrouting", nil},
	{iptables.TableFilter, "INPUT", ChainFilter, "steelyard ipvs filter", []string{"-m", "conntrack", "--ctstate", "NEW"}},
}

// ownChains are the chains rulesText writes, by table.
var ownChains = []struct {
	table iptables.Table
	chain iptables.Chain
}{
	{iptables.TableNAT, ChainServices},
	{iptables.TableNAT, ChainPostrouting},
	{iptables.TableFilter, ChainFilter},
}

func (j ipvsJump) args() []string {
	return append(append([]string(nil), j.match...), "-m", "comment", "--comment", j.note, "-j", string(j.to))
}

// rulesText renders the chains for iptables-restore --noflush; declaring a
// chain flushes it, so the text replaces them whole.
func rulesText(cfg Config) string {
	mark := cfg.Mark()
	// The sets of cfg's family (a set holds addresses of one family).
	f := cfg.Family
	setVIPs, setExternal, setExternalLocal := SetName(f, SetVIPs), SetName(f, SetExternal), SetName(f, SetExternalLocal)
	setDrop, setFirewall, setSourceRanges, setLoopback := SetName(f, SetDrop), SetName(f, SetFirewall), SetName(f, SetSourceRanges), SetName(f, SetLoopback)
	cidrs := cfg.CIDRs(f)
	var b strings.Builder
	add := func(c iptables.Chain, args ...string) {
		b.WriteString("-A " + string(c) + " " + strings.Join(args, " ") + "\n")
	}
	b.WriteString("*nat\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", ChainServices, ChainPostrouting)
	// External entry points: under the Local policy the client keeps its
	// address (the destination is on this node, the reply comes back
	// anyway); under Cluster every client is masqueraded, as kube-proxy
	// does, since the destination may be on another node.
	add(ChainServices, "-m", "set", "--match-set", setExternalLocal, "dst,dst", "-m", "comment", "--comment", `"steelyard: local policy keeps the client address"`, "-j", "RETURN")
	add(ChainServices, "-m", "set", "--match-set", setExternal, "dst,dst", "-m", "comment", "--comment", `"steelyard: external entry, cluster policy"`, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	// New connections to a clusterIP from outside the pod ranges are marked
	// for masquerading, so replies come back through this node.
	add(ChainServices, "-m", "set", "!", "--match-set", setVIPs, "dst,dst", "-j", "RETURN")
	switch {
	case cfg.MasqueradeAll:
		add(ChainServices, "-m", "comment", "--comment", `"steelyard: masquerade all"`, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	case len(cidrs) > 0:
		for _, c := range cidrs {
			add(ChainServices, "-s", c.String(), "-m", "comment", "--comment", `"steelyard: in-cluster client"`, "-j", "RETURN")
		}
		add(ChainServices, "-m", "comment", "--comment", `"steelyard: off-cluster client"`, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	}
	// A pod reaching itself through its VIP (hairpin) must be masqueraded,
	// else its reply goes straight to itself with the wrong source.
	add(ChainPostrouting, "-m", "comment", "--comment", `"steelyard: hairpin"`, "-m", "set", "--match-set", setLoopback, "dst,dst,src", "-j", "MASQUERADE")
	add(ChainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	add(ChainPostrouting, "-j", "MARK", "--set-xmark", "0x0/"+mark)
	add(ChainPostrouting, "-m", "comment", "--comment", `"steelyard: off-cluster client"`, "-j", "MASQUERADE", "--random-fully")
	b.WriteString("COMMIT\n")
	b.WriteString("*filter\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n", ChainFilter)
	add(ChainFilter, "-m", "set", "--match-set", setDrop, "dst,dst", "-m", "comment", "--comment", `"steelyard: local policy without a local endpoint"`, "-j", "DROP")
	add(ChainFilter, "-m", "set", "--match-set", setFirewall, "dst,dst", "-m", "set", "!", "--match-set", setSourceRanges, "dst,dst,src",
		"-m", "comment", "--comment", `"steelyard: source outside loadBalancerSourceRanges"`, "-j", "DROP")
	b.WriteString("COMMIT\n")
	return b.String()
}

// ensureRules writes the chains and the jumps from the built-in chains.
// Jumps found in one iptables-save are left alone: each check costs an
// iptables process (two families, a restart, a VM: seconds).
func ensureRules(ipt iptables.Interface, cfg Config) error {
	if err := ipt.Restore([]byte(rulesText(cfg))); err != nil {
		return fmt.Errorf("write masquerade rules: %w", err)
	}
	present := map[iptables.Chain]bool{} // by the built-in chain it is in

	if saved, err := ipt.SaveAll(); err == nil {
		if rs, err := iptables.ParseRuleset(saved); err == nil {
			for _, j := range ipvsJumps {
				if sc := rs.Chain(j.table, j.from); sc != nil {
					for _, r := range sc.Rules {
						if r.Jump == string(j.to) {
							present[j.from] = true
						}
					}
				}
			}
		}
	}
	for _, j := range ipvsJumps {
		if present[j.from] {
			continue
		}
		if err := ipt.EnsureRule(j.table, j.from, j.args()...); err != nil {
			return fmt.Errorf("ensure jump %s/%s -> %s: %w", j.table, j.from, j.to, err)
		}
	}
	return nil
}

// rulesInPlace reports, from one iptables-save, whether the chains hold as
// many rules as rulesText writes and the jumps exist: a full Sync then skips
// rewriting them (each iptables process costs, a lot in a VM). A hand edit
// that keeps the rule count is not detected.
func rulesInPlace(ipt iptables.Interface, cfg Config) bool {
	saved, err := ipt.SaveAll()
	if err != nil {
		return false
	}
	rs, err := iptables.ParseRuleset(saved)
	if err != nil {
		return false
	}
	want := map[iptables.Chain]int{}
	for _, l := range strings.Split(rulesText(cfg), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" {
			want[iptables.Chain(f[1])]++
		}
	}
	for _, oc := range ownChains {
		sc := rs.Chain(oc.table, oc.chain)
		if sc == nil || len(sc.Rules) != want[oc.chain] {
			return false
		}
	}
	for _, j := range ipvsJumps {
		sc := rs.Chain(j.table, j.from)
		if sc == nil {
			return false
		}
		found := false
		for _, r := range sc.Rules {
			if r.Jump == string(j.to) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// cleanupRules removes the jumps and the chains.
func cleanupRules(ipt iptables.Interface) error {
	for _, j := range ipvsJumps {
		if err := ipt.DeleteRule(j.table, j.from, j.args()...); err != nil {
			return fmt.Errorf("delete jump %s/%s -> %s: %w", j.table, j.from, j.to, err)
		}
	}
	for _, oc := range ownChains {
		if err := ipt.DeleteChain(oc.table, oc.chain); err != nil {
			return fmt.Errorf("delete chain %s/%s: %w", oc.table, oc.chain, err)
		}
	}
	return nil
}
