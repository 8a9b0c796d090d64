package ipvs

import (
	"fmt"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

// The iptables chains of the IPVS dataplane, in the nat table. They hold a
// fixed handful of rules whatever the number of Services: the VIPs and
// destinations they match are members of the ipsets (sets.go). They do not
// start with "STEELYARD-": the iptables mode owns that prefix and deletes
// the chains under it that it did not write, which would fail (and keep
// failing) while a jump to one of these exists, after a switch of mode
// without cleanup.
const (
	ChainServices    iptables.Chain = "IPVS-STEELYARD-SERVICES"
	ChainPostrouting iptables.Chain = "IPVS-STEELYARD-POSTROUTING"
)

type ipvsJump struct {
	from iptables.Chain
	to   iptables.Chain
	note string
}

var ipvsJumps = []ipvsJump{
	{"PREROUTING", ChainServices, "steelyard ipvs services"},
	{"OUTPUT", ChainServices, "steelyard ipvs services"},
	{"POSTROUTING", ChainPostrouting, "steelyard ipvs postrouting"},
}

func (j ipvsJump) args() []string {
	return []string{"-m", "comment", "--comment", j.note, "-j", string(j.to)}
}

// rulesText renders the two chains for iptables-restore --noflush; declaring
// a chain flushes it, so the text replaces them whole.
func rulesText(cfg Config) string {
	mark := fmt.Sprintf("0x%x", uint32(1)<<cfg.MasqueradeBit)
	var b strings.Builder
	add := func(c iptables.Chain, args ...string) {
		b.WriteString("-A " + string(c) + " " + strings.Join(args, " ") + "\n")
	}
	b.WriteString("*nat\n")
	fmt.Fprintf(&b, ":%s - [0:0]\n:%s - [0:0]\n", ChainServices, ChainPostrouting)
	// New connections to a VIP from outside the pod ranges are marked for
	// masquerading, so replies come back through this node.
	add(ChainServices, "-m", "set", "!", "--match-set", SetVIPs, "dst,dst", "-j", "RETURN")
	switch {
	case cfg.MasqueradeAll:
		add(ChainServices, "-m", "comment", "--comment", `"steelyard: masquerade all"`, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	case len(cfg.ClusterCIDRs) > 0:
		for _, c := range cfg.ClusterCIDRs {
			add(ChainServices, "-s", c.String(), "-m", "comment", "--comment", `"steelyard: in-cluster client"`, "-j", "RETURN")
		}
		add(ChainServices, "-m", "comment", "--comment", `"steelyard: off-cluster client"`, "-j", "MARK", "--set-xmark", mark+"/"+mark)
	}
	// A pod reaching itself through its VIP (hairpin) must be masqueraded,
	// else its reply goes straight to itself with the wrong source.
	add(ChainPostrouting, "-m", "comment", "--comment", `"steelyard: hairpin"`, "-m", "set", "--match-set", SetLoopback, "dst,dst,src", "-j", "MASQUERADE")
	add(ChainPostrouting, "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	add(ChainPostrouting, "-j", "MARK", "--set-xmark", "0x0/"+mark)
	add(ChainPostrouting, "-m", "comment", "--comment", `"steelyard: off-cluster client"`, "-j", "MASQUERADE", "--random-fully")
	b.WriteString("COMMIT\n")
	return b.String()
}

// ensureRules writes the chains and the jumps from the built-in chains.
func ensureRules(ipt iptables.Interface, cfg Config) error {
	if err := ipt.Restore([]byte(rulesText(cfg))); err != nil {
		return fmt.Errorf("write masquerade rules: %w", err)
	}
	for _, j := range ipvsJumps {
		if err := ipt.EnsureRule(iptables.TableNAT, j.from, j.args()...); err != nil {
			return fmt.Errorf("ensure jump nat/%s -> %s: %w", j.from, j.to, err)
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
	for c, n := range want {
		sc := rs.Chain(iptables.TableNAT, c)
		if sc == nil || len(sc.Rules) != n {
			return false
		}
	}
	for _, j := range ipvsJumps {
		sc := rs.Chain(iptables.TableNAT, j.from)
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
		if err := ipt.DeleteRule(iptables.TableNAT, j.from, j.args()...); err != nil {
			return fmt.Errorf("delete jump nat/%s -> %s: %w", j.from, j.to, err)
		}
	}
	for _, c := range []iptables.Chain{ChainServices, ChainPostrouting} {
		if err := ipt.DeleteChain(iptables.TableNAT, c); err != nil {
			return fmt.Errorf("delete chain nat/%s: %w", c, err)
		}
	}
	return nil
}
