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
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
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
	// eng runs the Syncs (the reconcile engine).
	eng *reconcile.Engine
	// applied is what the last successful Sync left in the kernel (nil
	// before the first and after a failure, when the engine makes the
	// next Sync full).
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
	return &Proxier{ipt: ipt, cfg: cfg, eng: reconcile.New()}
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

// Sync applies s in one iptables-restore, on the reconcile engine (which
// decides full or partial: asked, the first Sync, after a failure, or the
// canary rule gone) with ruleOps as this dataplane's operations. A
// partial Sync renders again only the Service ports of req.Changed,
// writes the chains whose rules changed since the last successful Sync
// and deletes the chains that are gone. A full Sync trusts no memory: it
// ensures the jumps from built-in chains, reads the live ruleset, and
// rewrites every steelyard chain that differs from the desired one
// (repairing hand edits) and deletes every steelyard chain that should
// not exist.
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	o := &ruleOps{p: p, s: s, req: req, start: time.Now()}
	res, err := p.eng.Sync(s, req, o)
	if err != nil {
		p.applied = nil
		return dataplane.SyncResult{}, err
	}
	return dataplane.SyncResult{Full: p.LastSync.Full, Written: res.Written}, nil
}

// ruleOps are the iptables dataplane's operations of one Sync
// (reconcile.Ops). The rules of every Service port meet in shared chains
// (STEELYARD-SERVICES lists every VIP), so they are rendered whole (the
// fragments of unchanged ports reused) and written by one
// iptables-restore in Commit; Update and Delete write nothing of their
// own.
type ruleOps struct {
	p     *Proxier
	s     dataplane.State
	req   dataplane.SyncRequest
	start time.Time
	// canaryMissing: Intact found the canary rule gone.
	canaryMissing bool
	full          bool
	desired       *Rules
	live          *liveChains
	stats         SyncStats
}

var _ reconcile.Ops = (*ruleOps)(nil)

// Wants implements reconcile.Ops: every port of the State (the family's).
func (o *ruleOps) Wants(*dataplane.ServicePort) bool { return true }

// Intact implements reconcile.Ops: a cheap check that nobody flushed the
// tables since the last Sync (a firewall reload, "iptables -F"): if so,
// resync everything now instead of at the next full sync.
func (o *ruleOps) Intact() bool {
	ok, err := o.p.canaryInPlace()
	if err == nil && ok {
		return true
	}
	l := log.WithFields(logrus.Fields{"table": canary.table, "chain": canary.from})
	if err != nil {
		// Not "flushed": the check itself failed (measured: the
		// xtables lock held by another program, TestChaosXtablesLock).
		l.WithError(err).Warn("cannot check the canary rule: full resync")
	} else {
		l.Warn("canary rule missing (tables flushed?): full resync")
	}
	o.canaryMissing = true
	return false
}

// Begin implements reconcile.Ops: it renders the desired rules and, in a
// full Sync, reads the live ruleset and ensures the jumps from built-in
// chains.
func (o *ruleOps) Begin(full bool, _ map[dataplane.ServicePortName]*dataplane.ServicePort) (reconcile.Plan, error) {
	p := o.p
	o.full = full
	if p.cfg.NodeAddresses != nil {
		p.cfg.NodePortAddresses = p.cfg.NodeAddresses()
	}
	// A Sync asked full or the first (or the one after a failure: the
	// changed set is relative to a state the kernel may not hold) renders
	// every port; one made full by the canary reuses the fragments, whose
	// rules are the same.
	req := o.req
	req.Full = full && !o.canaryMissing
	if req.Full {
		p.ensureCounter()
	}
	o.desired = renderWith(o.s, p.cfg, p.rendered, req)
	p.rendered = o.desired
	o.stats = SyncStats{Render: time.Since(o.start), RulesTotal: o.desired.Count(), Full: full, CanaryMissing: o.canaryMissing}
	if !full {
		return reconcile.Plan{}, nil
	}
	saved, err := p.ipt.SaveAll()
	if err != nil {
		return reconcile.Plan{}, err
	}
	o.live, err = cutSaved(saved)
	if err != nil {
		return reconcile.Plan{}, fmt.Errorf("parse iptables-save: %w", err)
	}
	// Before the restore: a missing target chain is created empty
	// here and filled by the restore (it differs from the desired one).
	if err := p.ensureJumps(o.live); err != nil {
		return reconcile.Plan{}, err
	}
	return reconcile.Plan{}, nil
}

// Update implements reconcile.Ops: the port's rules are in the render.
// The engine records sp itself, for its changed set only: the rules
// written are p.applied.
func (o *ruleOps) Update(_ dataplane.ServicePortName, _, sp *dataplane.ServicePort) *dataplane.ServicePort {
	// A copy: a pointer into the State would keep the Builder's whole
	// array of ports alive for as long as this port stays unchanged.
	return sp.Clone()
}

// Delete implements reconcile.Ops: the port's chains are missing from
// the render, and Commit deletes them.
func (o *ruleOps) Delete(dataplane.ServicePortName, *dataplane.ServicePort) {}

// Prune implements reconcile.Ops: a full Sync's Commit deletes every live
// steelyard chain the render lacks.
func (o *ruleOps) Prune(map[dataplane.ServicePortName]*dataplane.ServicePort) {}

// Commit implements reconcile.Ops: one iptables-restore of the chains that
// differ (from the live ruleset in a full Sync, from the last render in a
// partial one).
func (o *ruleOps) Commit(bool) error {
	p, desired, stats := o.p, o.desired, &o.stats
	write := map[Table][]Chain{}
	remove := map[Table][]Chain{}
	if o.full {
		live := o.live
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
		p.LastSync = *stats
		return nil
	}
	data := restoreText(desired, write, remove)
	stats.RestoreBytes = len(data)
	restoreStart := time.Now()
	if err := p.ipt.Restore(data); err != nil {
		// The kernel kept the previous ruleset; the engine makes the next
		// Sync full.
		return err
	}
	stats.Restore = time.Since(restoreStart)
	p.applied = desired
	p.LastSync = *stats
	return nil
}

// Done implements reconcile.Ops.
func (o *ruleOps) Done(bool) {}

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
	p.eng.Reset()
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
