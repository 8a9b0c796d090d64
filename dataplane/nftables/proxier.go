// Package nftables is steelyard's nftables dataplane: one private table per
// IP family ("ip steelyard", "ip6 steelyard") holding a verdict map from
// VIP to a per Service port chain, which splits new connections by weight
// with numgen draws and DNATs them in per endpoint chains.
//
// Only the clusterIP entry point is served in this version: node ports,
// external and load-balancer IPs, Local traffic policies and session
// affinity are not programmed (Sync logs what it leaves out).
package nftables

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

var log = logrus.WithField("subsys", "nftables")

// TableName is the name of steelyard's table in each family.
const TableName = "steelyard"

// DefaultMasqueradeBit is the fwmark bit used when Config leaves it zero,
// the same as the iptables dataplane's.
const DefaultMasqueradeBit = 13

// Buckets is the numgen modulus used when the weights are not small
// integers: each backend's share is then exact within 100/Buckets points.
const Buckets = 1000000

// The fixed objects of the table.
const (
	chainServices       = "services"
	chainMarkMasq       = "mark-for-masquerade"
	chainMasquerading   = "masquerading"
	chainNoEndpoints    = "no-endpoints-check"
	mapServiceIPs       = "service-ips"
	setNoEndpoints      = "no-endpoint-services"
	svcPrefix           = "svc-"
	epPrefix            = "ep-"
	syncTimeout         = 5 * time.Minute
	chainNATPrerouting  = "nat-prerouting"
	chainNATOutput      = "nat-output"
	chainNATPostrouting = "nat-postrouting"
	chainFilterInput    = "filter-input"
	chainFilterForward  = "filter-forward"
	chainFilterOutput   = "filter-output"
)

// Config configures a Proxier.
type Config struct {
	// Masquerade says which new connections to a VIP are masqueraded, as
	// in every dataplane.
	dataplane.Masquerade
	// Family is 4 or 6 (0: 4).
	Family int
}

func (c Config) mark() string {
	bit := c.MasqueradeBit
	if bit == 0 {
		bit = DefaultMasqueradeBit
	}
	return fmt.Sprintf("0x%x", uint32(1)<<bit)
}

// fam holds the spellings that differ between the ip and ip6 families.
type fam struct {
	nfFamily knftables.Family
	ip       string // "ip" or "ip6" (address match prefix)
	addrType string // "ipv4_addr" or "ipv6_addr"
}

func famOf(family int) fam {
	if family == 6 {
		return fam{knftables.IPv6Family, "ip6", "ipv6_addr"}
	}
	return fam{knftables.IPv4Family, "ip", "ipv4_addr"}
}

// Proxier programs one family's table.
type Proxier struct {
	nft knftables.Interface
	cfg Config
	f   fam

	// applied is what the last successful Sync wrote, by Service chain.
	applied map[string]*rendered
	// synced is false until a Sync succeeded (the next one is full).
	synced bool
	// lastFull is whether the last successful Sync was full.
	lastFull bool
	// textRules reads rules with "nft list table" (the real nft); nil
	// chainRules outside Explain.
	textRules  bool
	chainRules map[string][]*knftables.Rule
	// warned holds the Service ports whose unsupported features were logged.
	warned map[string]string
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// NewProxier returns a Proxier writing through nft, an Interface bound to
// the family of cfg and TableName.
func NewProxier(nft knftables.Interface, cfg Config) *Proxier {
	if cfg.Family == 0 {
		cfg.Family = 4
	}
	return &Proxier{nft: nft, cfg: cfg, f: famOf(cfg.Family), applied: map[string]*rendered{}, warned: map[string]string{}}
}

// NewKernel returns a Proxier over the nft binary for cfg.Family.
func NewKernel(cfg Config) (*Proxier, error) {
	nft, err := knftables.New(famOf(cfg.Family).nfFamily, TableName)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	p := NewProxier(nft, cfg)
	p.textRules = true
	return p, nil
}

// rendered is one Service port as written: its map element or no-endpoint
// set element, its chain and its endpoint chains with their rules.
type rendered struct {
	src     *dataplane.ServicePort
	masq    Config
	key     []string // VIP . proto . port
	comment string
	reject  bool
	svc     string
	// chains are the Service chain then the endpoint chains, with rules.
	chains []string
	rules  map[string][]string
}

func (r *rendered) equal(o *rendered) bool {
	if r.reject != o.reject || r.svc != o.svc || r.comment != o.comment || !slices.Equal(r.key, o.key) || !slices.Equal(r.chains, o.chains) {
		return false
	}
	for _, c := range r.chains {
		if !slices.Equal(r.rules[c], o.rules[c]) {
			return false
		}
	}
	return true
}

func clonePort(sp *dataplane.ServicePort) *dataplane.ServicePort {
	c := *sp
	c.Backends = slices.Clone(sp.Backends)
	c.ExternalIPs = slices.Clone(sp.ExternalIPs)
	c.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
	c.SourceRanges = slices.Clone(sp.SourceRanges)
	return &c
}

// chainName returns prefix + a hash of key + a readable (trimmed) suffix.
func chainName(prefix, key, readable string) string {
	sum := sha256.Sum256([]byte(key))
	h := strings.ToLower(base32.StdEncoding.EncodeToString(sum[:])[:8])
	readable = strings.NewReplacer(":", ".", "[", "", "]", "").Replace(readable)
	if len(readable) > 180 {
		readable = readable[:180]
	}
	return prefix + h + "-" + readable
}

// Split returns the numgen modulus and each weight's count of buckets:
// the weights themselves when they are integers summing to at most
// Buckets, else Buckets divided by largest remainder.
func Split(weights []float64) (uint64, []uint64) {
	counts := make([]uint64, len(weights))
	var sum float64
	integers := true
	for _, w := range weights {
		sum += w
		if w != float64(uint64(w)) {
			integers = false
		}
	}
	if sum <= 0 {
		return 0, counts
	}
	if integers && sum <= Buckets {
		for i, w := range weights {
			counts[i] = uint64(w)
		}
		return uint64(sum), counts
	}
	var used uint64
	rem := make([]float64, len(weights))
	for i, w := range weights {
		exact := w / sum * Buckets
		counts[i] = uint64(exact)
		rem[i] = exact - float64(counts[i])
		used += counts[i]
	}
	idx := make([]int, len(weights))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case rem[a] > rem[b]:
			return -1
		case rem[a] < rem[b]:
			return 1
		}
		return 0
	})
	for i := 0; used < Buckets; i = (i + 1) % len(idx) {
		counts[idx[i]]++
		used++
	}
	return Buckets, counts
}

func (p *Proxier) render(sp *dataplane.ServicePort) *rendered {
	name := sp.Name.String()
	proto := sp.VIP.Protocol.Lower()
	svcKey := name + "|" + sp.VIP.String()
	r := &rendered{
		src:     clonePort(sp),
		key:     []string{sp.VIP.IP.String(), proto, fmt.Sprint(sp.VIP.Port)},
		comment: name,
		rules:   map[string][]string{},
	}
	bs := sp.InternalBackends()
	if len(bs) == 0 {
		r.reject = true
		return r
	}
	r.svc = chainName(svcPrefix, svcKey, sp.Name.Namespace+"/"+sp.Name.Name+"/"+proto+"/"+sp.Name.Port)
	r.chains = append(r.chains, r.svc)
	var svcRules []string
	if p.cfg.MasqueradeAll {
		svcRules = append(svcRules, "jump "+chainMarkMasq)
	} else if cidrs := p.cidrs(); cidrs != "" {
		svcRules = append(svcRules, p.f.ip+" saddr != "+cidrs+" jump "+chainMarkMasq)
	}
	weights := make([]float64, len(bs))
	for i, b := range bs {
		weights[i] = b.Weight
	}
	_, counts := Split(weights)
	// Each arm draws its own number: arm i takes c_i of the R_i buckets
	// left to it (R_i = the counts of arms i..n), so its share is exactly
	// c_i / N. No anonymous verdict maps: nft 1.0.6 handles tens of
	// thousands of them in quadratic time (48 s for 20,000 rules).
	type arm struct {
		count uint64
		ep    string
	}
	var arms []arm
	var left uint64
	for i, b := range bs {
		addr := b.Addr().String()
		ep := chainName(epPrefix, svcKey+"|"+addr, sp.Name.Namespace+"/"+sp.Name.Name+"/"+sp.Name.Port+"__"+addr)
		r.chains = append(r.chains, ep)
		r.rules[ep] = []string{
			p.f.ip + " saddr " + b.IP.String() + " jump " + chainMarkMasq,
			"meta l4proto " + proto + " dnat to " + addr,
		}
		if counts[i] == 0 {
			continue // too small a weight for one bucket
		}
		arms = append(arms, arm{counts[i], ep})
		left += counts[i]
	}
	for i, a := range arms {
		if i == len(arms)-1 {
			svcRules = append(svcRules, "goto "+a.ep)
			break
		}
		svcRules = append(svcRules, fmt.Sprintf("numgen random mod %d < %d goto %s", left, a.count, a.ep))
		left -= a.count
	}
	r.rules[r.svc] = svcRules
	return r
}

// cidrs returns the anonymous set of this family's cluster CIDRs, or "".
func (p *Proxier) cidrs() string {
	var out []string
	for _, c := range p.cfg.ClusterCIDRs {
		if (p.cfg.Family == 6) == c.Addr().Is6() {
			out = append(out, c.String())
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "{ " + strings.Join(out, ", ") + " }"
}

// warn logs, once per Service port and set of features, what is not served.
func (p *Proxier) warn(sp *dataplane.ServicePort) {
	var missing []string
	if sp.NodePort != 0 {
		missing = append(missing, "nodePort")
	}
	if len(sp.ExternalIPs) > 0 {
		missing = append(missing, "externalIPs")
	}
	if len(sp.LoadBalancerIPs) > 0 {
		missing = append(missing, "loadBalancerIPs")
	}
	if sp.ExternalLocal {
		missing = append(missing, "externalTrafficPolicy Local")
	}
	if sp.InternalLocal {
		missing = append(missing, "internalTrafficPolicy Local")
	}
	if sp.AffinitySeconds > 0 {
		missing = append(missing, "sessionAffinity")
	}
	key := sp.Name.String() + "|" + sp.VIP.String()
	what := strings.Join(missing, ", ")
	if what == "" || p.warned[key] == what {
		return
	}
	p.warned[key] = what
	log.WithFields(logrus.Fields{"service": sp.Name.String(), "vip": sp.VIP.String(), "unsupported": what}).
		Warn("nftables mode serves the clusterIP only; these features of the Service port are not programmed")
}

func (p *Proxier) table() *knftables.Table {
	return &knftables.Table{Comment: knftables.PtrTo("steelyard: weighted Service VIPs")}
}

// skeleton adds (and, when full, flushes and refills) the fixed objects.
func (p *Proxier) skeleton(tx *knftables.Transaction, full bool) {
	tx.Add(p.table())
	type base struct {
		name string
		typ  knftables.BaseChainType
		hook knftables.BaseChainHook
		prio knftables.BaseChainPriority
		rule string
	}
	bases := []base{
		{chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, "jump " + chainServices},
		{chainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority, "jump " + chainServices},
		{chainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, "jump " + chainMasquerading},
		{chainFilterInput, knftables.FilterType, knftables.InputHook, knftables.FilterPriority, "ct state new jump " + chainNoEndpoints},
		{chainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority, "ct state new jump " + chainNoEndpoints},
		{chainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority, "ct state new jump " + chainNoEndpoints},
	}
	mark := p.cfg.mark()
	regular := map[string][]string{
		chainServices:     {p.f.ip + " daddr . meta l4proto . th dport vmap @" + mapServiceIPs},
		chainMarkMasq:     {"meta mark set meta mark | " + mark},
		chainMasquerading: {"meta mark & " + mark + " == 0 return", "meta mark set meta mark ^ " + mark, "masquerade fully-random"},
		chainNoEndpoints:  {p.f.ip + " daddr . meta l4proto . th dport @" + setNoEndpoints + " reject"},
	}
	tx.Add(&knftables.Map{Name: mapServiceIPs, Type: p.f.addrType + " . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Set{Name: setNoEndpoints, Type: p.f.addrType + " . inet_proto . inet_service"})
	if !full {
		return
	}
	tx.Flush(&knftables.Map{Name: mapServiceIPs})
	tx.Flush(&knftables.Set{Name: setNoEndpoints})
	// Regular chains first: the base chains jump to them.
	for _, name := range []string{chainMarkMasq, chainMasquerading, chainNoEndpoints, chainServices} {
		tx.Add(&knftables.Chain{Name: name})
		tx.Flush(&knftables.Chain{Name: name})
		for _, r := range regular[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: r})
		}
	}
	for _, b := range bases {
		tx.Add(&knftables.Chain{Name: b.name, Type: knftables.PtrTo(b.typ), Hook: knftables.PtrTo(b.hook), Priority: knftables.PtrTo(b.prio)})
		tx.Flush(&knftables.Chain{Name: b.name})
		tx.Add(&knftables.Rule{Chain: b.name, Rule: b.rule})
	}
}

// writeChains adds, flushes and fills the chains of r (endpoint chains
// first: the Service chain's vmap refers to them).
func writeChains(tx *knftables.Transaction, r *rendered) {
	for i := len(r.chains) - 1; i >= 0; i-- {
		c := r.chains[i]
		tx.Add(&knftables.Chain{Name: c})
		tx.Flush(&knftables.Chain{Name: c})
		for _, rule := range r.rules[c] {
			tx.Add(&knftables.Rule{Chain: c, Rule: rule, Comment: knftables.PtrTo(r.comment)})
		}
	}
}

func (p *Proxier) element(r *rendered) *knftables.Element {
	if r.reject {
		return &knftables.Element{Set: setNoEndpoints, Key: r.key, Comment: knftables.PtrTo(r.comment)}
	}
	return &knftables.Element{Map: mapServiceIPs, Key: r.key, Value: []string{"goto " + r.svc}, Comment: knftables.PtrTo(r.comment)}
}

// Sync implements dataplane.Dataplane with one nft transaction. (It does
// not use req.Changed yet: it compares each port with what it applied.)
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	if err := p.sync(s, req.Full); err != nil {
		return dataplane.SyncResult{}, err
	}
	return dataplane.SyncResult{Full: p.lastFull}, nil
}

func (p *Proxier) sync(s dataplane.State, full bool) error {
	start := time.Now()
	full = full || !p.synced
	desired := map[string]*rendered{}
	byKey := map[string]*rendered{}
	for i := range s.Services {
		sp := &s.Services[i]
		if sp.Family() != p.cfg.Family {
			continue
		}
		p.warn(sp)
		k := sp.VIP.IP.String() + " . " + sp.VIP.Protocol.Lower() + " . " + strconv.Itoa(int(sp.VIP.Port))
		// An unchanged Service port keeps its rendering: a partial sync
		// then costs one comparison per Service, not one render.
		r := p.applied[k]
		if r == nil || !r.src.Equal(sp) {
			r = p.render(sp)
		}
		if old, dup := byKey[k]; dup {
			log.WithFields(logrus.Fields{"vip": k, "service": r.comment, "kept": old.comment}).Warn("two Service ports share a VIP; the first is kept")
			continue
		}
		byKey[k] = r
		desired[k] = r
	}

	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	tx := p.nft.NewTransaction()
	p.skeleton(tx, full)
	written := 0
	if full {
		live := map[string]bool{}
		chains, err := p.nft.List(ctx, "chains")
		if err != nil && !knftables.IsNotFound(err) {
			return fmt.Errorf("nftables: list chains: %w", err)
		}
		for _, c := range chains {
			live[c] = true
		}
		keep := map[string]bool{}
		for _, k := range sortedKeys(desired) {
			r := desired[k]
			writeChains(tx, r)
			tx.Add(p.element(r))
			for _, c := range r.chains {
				keep[c] = true
			}
			written++
		}
		// Stale chains: flushed first (they may refer to each other), then deleted.
		var stale []string
		for _, c := range chains {
			if (strings.HasPrefix(c, svcPrefix) || strings.HasPrefix(c, epPrefix)) && !keep[c] {
				stale = append(stale, c)
			}
		}
		slices.Sort(stale)
		for _, c := range stale {
			tx.Flush(&knftables.Chain{Name: c})
		}
		for _, c := range stale {
			tx.Delete(&knftables.Chain{Name: c})
		}
	} else {
		var drop []string // chains to delete after everything else
		for _, k := range sortedKeys(p.applied) {
			old := p.applied[k]
			r, ok := desired[k]
			if ok && r.equal(old) {
				continue
			}
			tx.Delete(p.element(old))
			keep := map[string]bool{}
			if ok {
				for _, c := range r.chains {
					keep[c] = true
				}
			}
			for _, c := range old.chains {
				if !keep[c] {
					tx.Flush(&knftables.Chain{Name: c})
					drop = append(drop, c)
				}
			}
		}
		for _, k := range sortedKeys(desired) {
			r := desired[k]
			if old, ok := p.applied[k]; ok && r.equal(old) {
				continue
			}
			writeChains(tx, r)
			tx.Add(p.element(r))
			written++
		}
		for _, c := range drop {
			tx.Delete(&knftables.Chain{Name: c})
		}
	}
	if err := p.nft.Run(ctx, tx); err != nil {
		p.synced = false // the next sync rewrites everything
		return fmt.Errorf("nftables: %w", err)
	}
	p.applied = desired
	p.synced = true
	p.lastFull = full
	log.WithFields(logrus.Fields{"full": full, "services": len(desired), "written": written, "operations": tx.NumOperations(), "took": time.Since(start)}).Debug("synced")
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Cleanup implements dataplane.Dataplane: it deletes steelyard's table of
// this family, and nothing else.
func (p *Proxier) Cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if _, err := p.nft.List(ctx, "chains"); err != nil {
		if knftables.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("nftables: %w", err)
	}
	tx := p.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := p.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("nftables: delete table: %w", err)
	}
	p.applied = map[string]*rendered{}
	p.synced = false
	return nil
}
