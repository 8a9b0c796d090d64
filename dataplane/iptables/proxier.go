// Package iptables is steelyard's iptables dataplane: it renders the desired
// state into STEELYARD- chains (weights become statistic probabilities, see
// probability.go), applies them with one iptables-restore --noflush per sync,
// and reads the live kernel back for explain and verify (ruleset.go,
// trace.go, explain.go).
package iptables

import (
	iptk "github.com/steelyard-net/steelyard/internal/iptables"

	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

var log = logrus.WithField("subsys", "iptables")

// jump is a rule in a built-in chain that leads into steelyard's chains.
// These are the only rules written one by one (go-iptables); everything
// else goes through iptables-restore.
type jump struct {
	table Table
	from  Chain
	args  []string
}

func (j jump) target() Chain { return Chain(j.args[len(j.args)-1]) }

var jumps = []jump{
	{TableNAT, "PREROUTING", []string{"-m", "comment", "--comment", "steelyard service portals", "-j", string(ChainServices)}},
	{TableNAT, "OUTPUT", []string{"-m", "comment", "--comment", "steelyard service portals", "-j", string(ChainServices)}},
	{TableNAT, "POSTROUTING", []string{"-m", "comment", "--comment", "steelyard postrouting", "-j", string(ChainPostrouting)}},
	{TableFilter, "FORWARD", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "steelyard service portals", "-j", string(ChainServices)}},
	{TableFilter, "OUTPUT", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "steelyard service portals", "-j", string(ChainServices)}},
	// Node ports (and external IPs the node holds) are delivered locally.
	{TableFilter, "INPUT", []string{"-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "steelyard service portals", "-j", string(ChainServices)}},
	// Every packet: the martian drop of localhost node ports (localhost.go).
	{TableFilter, "INPUT", []string{"-m", "comment", "--comment", "steelyard firewall", "-j", string(ChainFirewall)}},
	canary,
}

// Proxier is the iptables Dataplane.
type Proxier struct {
	ipt Interface
	cfg Config
	// applied is what the last successful Sync left in the kernel; nil
	// forces the next Sync to be full (at start and after a failure).
	applied *Rules
	// rendered is the last render, whose fragments the next render reuses.
	rendered *Rules
	// LastSync describes the last successful Sync, for logs and benchmarks.
	LastSync SyncStats
	// counterWarned: the missing nfacct object was logged once.
	counterWarned bool
}

// SyncStats describes one Sync.
type SyncStats struct {
	Full bool
	// CanaryMissing: a partial Sync found the canary rule gone and ran
	// full instead.
	CanaryMissing bool
	ChainsWritten int
	ChainsDeleted int
	RulesWritten  int
	RulesTotal    int
	RestoreBytes  int
	Render        time.Duration
	Restore       time.Duration
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// NewProxier returns a Proxier writing through ipt.
func NewProxier(ipt Interface, cfg Config) *Proxier {
	return &Proxier{ipt: ipt, cfg: cfg}
}

// NewDualStack returns the dual-stack iptables dataplane: a Proxier over
// ipt4 (iptables) and one over ipt6 (ip6tables; nil: IPv4 only), with cfg
// for both (each takes the addresses and CIDRs of its own family).
func NewDualStack(ipt4, ipt6 Interface, cfg Config) *dataplane.DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	if ipt6 == nil {
		return dataplane.NewDualStack(NewProxier(ipt4, c4), nil)
	}
	return dataplane.NewDualStack(NewProxier(ipt4, c4), NewProxier(ipt6, c6))
}

// Sync applies s in one iptables-restore. A partial Sync renders again only
// the Service ports of req.Changed, writes the chains whose rules changed
// since the last successful Sync and deletes the chains that are gone. A full Sync trusts no memory: it ensures the jumps
// from built-in chains, reads the live ruleset, and rewrites every steelyard
// chain that differs from the desired one (repairing hand edits) and
// deletes every steelyard chain that should not exist.
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	if err := p.sync(s, req); err != nil {
		return dataplane.SyncResult{}, err
	}
	return dataplane.SyncResult{Full: p.LastSync.Full}, nil
}

func (p *Proxier) sync(s dataplane.State, req dataplane.SyncRequest) error {
	start := time.Now()
	if p.cfg.NodeAddresses != nil {
		p.cfg.NodePortAddresses = p.cfg.NodeAddresses()
	}
	full := req.Full
	if p.applied == nil {
		// The first Sync, or the one after a failure: the changed set
		// is relative to a state the kernel may not hold.
		full = true
	}
	req.Full = full
	if full {
		p.ensureCounter()
	}
	desired := renderWith(s, p.cfg, p.rendered, req)
	p.rendered = desired
	stats := SyncStats{Render: time.Since(start), RulesTotal: desired.Count()}
	if !full {
		// Cheap check that nobody flushed the tables since the last Sync
		// (a firewall reload, "iptables -F"): if so, resync everything now
		// instead of at the next full sync.
		ok, err := p.canaryInPlace()
		if err != nil || !ok {
			l := log.WithFields(logrus.Fields{"table": canary.table, "chain": canary.from})
			if err != nil {
				// Not "flushed": the check itself failed (measured: the
				// xtables lock held by another program, TestChaosXtablesLock).
				l.WithError(err).Warn("cannot check the canary rule: full resync")
			} else {
				l.Warn("canary rule missing (tables flushed?): full resync")
			}
			full = true
			stats.CanaryMissing = true
		}
	}
	stats.Full = full

	write := map[Table][]Chain{}
	remove := map[Table][]Chain{}
	if full {
		saved, err := p.ipt.SaveAll()
		if err != nil {
			p.applied = nil
			return err
		}
		live, err := cutSaved(saved)
		if err != nil {
			p.applied = nil
			return fmt.Errorf("parse iptables-save: %w", err)
		}
		// Before the restore: a missing target chain is created empty
		// here and filled by the restore (it differs from the desired one).
		if err := p.ensureJumps(live); err != nil {
			p.applied = nil
			return err
		}
		for _, t := range desired.Tables() {
			// Rewrite only the chains that differ from the kernel: this
			// repairs hand edits and stale state without paying for a
			// whole-ruleset restore (iptables-nft's restore time grows with
			// jumps x chains: minutes at 10,000 Services).
			for _, c := range desired.Chains(t) {
				if !sameRules(live, t, c, desired.RulesOf(t, c)) {
					write[t] = append(write[t], c)
				}
			}
			for _, c := range live.order[t] {
				if !desired.Has(t, c) {
					remove[t] = append(remove[t], c)
				}
			}
		}
	} else {
		write, remove = partialDiff(p.applied, desired)
	}
	for _, t := range desired.Tables() {
		stats.ChainsWritten += len(write[t])
		stats.ChainsDeleted += len(remove[t])
		for _, c := range write[t] {
			stats.RulesWritten += len(desired.RulesOf(t, c))
		}
	}
	if stats.ChainsWritten == 0 && stats.ChainsDeleted == 0 {
		// The kernel already holds desired (a full Sync checked it, or a
		// partial one found nothing changed): remember it, or after a
		// restart over rules left in place every Sync would stay full.
		p.applied = desired
		p.LastSync = stats
		return nil
	}
	data := restoreText(desired, write, remove)
	stats.RestoreBytes = len(data)
	restoreStart := time.Now()
	if err := p.ipt.Restore(data); err != nil {
		// The kernel kept the previous ruleset; rebuild everything next time.
		p.applied = nil
		return err
	}
	stats.Restore = time.Since(restoreStart)
	p.applied = desired
	p.LastSync = stats
	return nil
}

// partialDiff returns the chains that differ between what was applied and
// what is desired. Service ports whose fragment is shared between the two
// renders are unchanged and skipped without looking at their rules.
func partialDiff(applied, desired *Rules) (write, remove map[Table][]Chain) {
	write, remove = map[Table][]Chain{}, map[Table][]Chain{}
	changed := func(t Table, c Chain) bool {
		return !applied.Has(t, c) || !slices.Equal(applied.RulesOf(t, c), desired.RulesOf(t, c))
	}
	// The shared and static chains.
	for _, t := range desired.Tables() {
		for _, c := range []Chain{ChainServices, ChainNodePorts, ChainForward, ChainMarkMasq, ChainPostrouting, ChainFirewall} {
			if desired.Has(t, c) && changed(t, c) {
				write[t] = append(write[t], c)
			}
		}
	}
	for name, f := range desired.frags {
		old := applied.frags[name]
		if old == f {
			continue
		}
		for _, fc := range f.owned() {
			if changed(fc.table, fc.chain) {
				write[fc.table] = append(write[fc.table], fc.chain)
			}
		}
	}
	for name, old := range applied.frags {
		if desired.frags[name] == old {
			continue
		}
		for _, fc := range old.owned() {
			if !desired.Has(fc.table, fc.chain) {
				remove[fc.table] = append(remove[fc.table], fc.chain)
			}
		}
	}
	for _, t := range desired.Tables() {
		// Deterministic restore text, whatever the map order.
		sortedChains(write[t])
		sortedChains(remove[t])
	}
	return write, remove
}

// canary is the rule whose presence shows that the tables still hold
// what the last Sync wrote. It is the jump from filter FORWARD because the
// filter table is small: iptables-legacy reads a whole table for each
// check, and the nat table's read costs about 1.2 s at 10,000 Services,
// the filter table's 5 ms. A flush of the filter table (or of every table,
// as a firewall reload does) removes it; a flush of the nat table alone is
// repaired by the next full sync.
var canary = jump{TableFilter, "FORWARD", []string{"-m", "comment", "--comment", "steelyard forwarding rules", "-j", string(ChainForward)}}

// canaryInPlace reports whether the canary rule is in the kernel.
func (p *Proxier) canaryInPlace() (bool, error) {
	return p.ipt.HasRule(canary.table, canary.from, canary.args...)
}

// ensureJumps writes the jumps from built-in chains that live (the saved
// ruleset) lacks, one iptables call each.
func (p *Proxier) ensureJumps(live *liveChains) error {
	for _, j := range jumps {
		if live.hasJump(j) {
			continue
		}
		if err := p.ipt.EnsureChain(j.table, j.target()); err != nil {
			return fmt.Errorf("ensure chain %s/%s: %w", j.table, j.target(), err)
		}
		if err := p.ipt.EnsureRule(j.table, j.from, j.args...); err != nil {
			return fmt.Errorf("ensure jump %s/%s -> %s: %w", j.table, j.from, j.target(), err)
		}
	}
	return nil
}

// Explain reads the live kernel and returns what each VIP does.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	rs, err := p.liveRuleset()
	if err != nil {
		return nil, err
	}
	return Views(rs)
}

// liveRuleset reads and parses the live ruleset.
func (p *Proxier) liveRuleset() (*Ruleset, error) {
	saved, err := p.ipt.SaveAll()
	if err != nil {
		return nil, err
	}
	rs, err := ParseRuleset(saved)
	if err != nil {
		return nil, fmt.Errorf("parse iptables-save: %w", err)
	}
	return rs, nil
}

// Cleanup removes the jumps from built-in chains and every STEELYARD- chain,
// and nothing else. Jumps are found in the live ruleset, so those written
// by an older release with other comments go too.
func (p *Proxier) Cleanup() error {
	p.applied = nil
	saved, err := p.ipt.SaveAll()
	if err != nil {
		return err
	}
	live, err := ParseRuleset(saved)
	if err != nil {
		return fmt.Errorf("parse iptables-save: %w", err)
	}
	remove := map[Table][]Chain{}
	n := 0
	for _, t := range []Table{TableFilter, TableNAT} {
		st := live.Tables[t]
		if st == nil {
			continue
		}
		for _, c := range st.Order {
			if !iptk.BuiltinChain(c) {
				continue
			}
			for _, r := range st.Chains[c].Rules {
				if !strings.HasPrefix(r.Jump, ChainPrefix) {
					continue
				}
				args, err := iptk.Tokenize(r.Text)
				if err != nil {
					return err
				}
				if err := p.ipt.DeleteRule(t, c, args...); err != nil {
					return fmt.Errorf("delete jump %s/%s -> %s: %w", t, c, r.Jump, err)
				}
			}
		}
		remove[t] = live.SteelyardChains(t)
		n += len(remove[t])
	}
	if n == 0 {
		deleteLegacyCounters(p.cfg.NFAcct)
		return nil
	}
	if err := p.ipt.Restore(restoreText(newRules(), nil, remove)); err != nil {
		return err
	}
	deleteLegacyCounters(p.cfg.NFAcct)
	log.WithField("chains", n).Info("removed steelyard chains")
	return nil
}

// sameRules reports whether a live chain holds exactly the desired rules.
// iptables-save prints what we wrote with small differences (quotes only
// where needed, probabilities from the kernel's 31-bit fixed point), so
// rules are compared token by token and probabilities by value.
func sameRules(live *liveChains, t Table, c Chain, desired []string) bool {
	rules, ok := live.chain(t, c)
	if !ok || len(rules) != len(desired) {
		return false
	}
	for i, r := range rules {
		if !sameRule(r, desired[i]) {
			return false
		}
	}
	return true
}

// probabilityTolerance covers the kernel's rounding of p to 31 bits.
const probabilityTolerance = 1e-9

func sameRule(a, b string) bool {
	if a == b {
		return true
	}
	ta, errA := iptk.Tokenize(a)
	tb, errB := iptk.Tokenize(b)
	if errA != nil || errB != nil || len(ta) != len(tb) {
		return false
	}
	for i := range ta {
		if ta[i] == tb[i] {
			continue
		}
		if i == 0 || ta[i-1] != "--probability" {
			return false
		}
		pa, errA := strconv.ParseFloat(ta[i], 64)
		pb, errB := strconv.ParseFloat(tb[i], 64)
		if errA != nil || errB != nil || math.Abs(pa-pb) > probabilityTolerance {
			return false
		}
	}
	return true
}
