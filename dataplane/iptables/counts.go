package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
)

// Counting new connections per endpoint (issue 23): the DNAT rule of each
// endpoint chain counts, in its own packet counter, the first packet of
// each connection it sends there (nat rules see only that packet), so the
// counter is the endpoint's count of new connections. Reading every count
// is one iptables-save -c of the nat table.
//
// The counter outlives every restore that leaves the endpoint chain alone:
// iptables-restore --noflush carries the counters of untouched rules over
// (legacy: libiptc adds the old counters back after replacing the table;
// nft: the rules are not touched), and a sync writes only the chains whose
// rules changed. An endpoint chain's rules depend only on its name (the
// hash of Service port, protocol and endpoint) but for session affinity,
// so its count resets only when affinity is turned on or off or a full
// sync repairs a hand edit of the chain; Prometheus' rate() reads a reset
// as one. Agent restarts keep the counts (the full sync finds the chains
// in place).
//
// Until this commit each endpoint had an nfacct object instead. The kernel
// keeps those in one list per namespace and finds a name by walking it
// (creation, deletion, and each -m nfacct rule an iptables-legacy restore
// checks: every rule of the table, at every sync), so 100,000 endpoints
// cost about 10^10 name comparisons per sync: measured 6.7 s for 20,000
// creations, 4x 10,000's, and the 10,000-Service benchmark never finished
// (docs/benchmarks.md). A rule counter costs nothing at sync time.

// legacyCounterPrefix starts the names of the nfacct objects that older
// releases made per endpoint; Cleanup deletes any left.
const legacyCounterPrefix = "sy-ep-"

// Counts implements dataplane.Dataplane: the counter of each endpoint
// chain's DNAT rule, from one iptables-save -c of the nat table. The rules
// count whatever the flags (like IPVS's statistics); --count-connections
// only makes the agent export them.
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	saved, err := p.ipt.SaveCounters(TableNAT)
	if err != nil {
		return nil, err
	}
	rs, err := ParseRuleset(saved)
	if err != nil {
		return nil, fmt.Errorf("parse iptables-save -c: %w", err)
	}
	nat := rs.Tables[TableNAT]
	if nat == nil {
		return nil, nil
	}
	var out []dataplane.EndpointCount
	names := chainServices(nat)
	for _, c := range nat.Order {
		if !strings.HasPrefix(string(c), sepPrefix) {
			continue
		}
		for _, r := range nat.Chains[c].Rules {
			if r.Jump != "DNAT" {
				continue
			}
			ep, err := netip.ParseAddrPort(r.TargetArgs["--to-destination"])
			if err != nil {
				return nil, fmt.Errorf("chain %s: DNAT to %q: %w", c, r.TargetArgs["--to-destination"], err)
			}
			svc := r.Comment
			if svc == "" {
				// Terse rules (terseEndpoints): named by the entry rules.
				svc = names[c]
			}
			out = append(out, dataplane.EndpointCount{Service: svc, Protocol: dataplane.Protocol(strings.ToUpper(r.Protocol)), Endpoint: ep, NewConnections: r.Packets})
		}
	}
	return dataplane.MergeCounts(out), nil
}

// chainServices names each chain of a Service port by the comment of the
// rules in STEELYARD-SERVICES and STEELYARD-NODEPORTS that lead to it,
// through its external, firewall, Service and local chains down to its
// endpoint chains, whose rules above terseEndpoints carry no comment.
func chainServices(nat *SavedTable) map[Chain]string {
	names := map[Chain]string{}
	// own reports whether chain c belongs to one Service port.
	own := func(c string) bool {
		for _, p := range []string{svcPrefix, svlPrefix, extPrefix, fwPrefix, sepPrefix} {
			if strings.HasPrefix(c, p) {
				return true
			}
		}
		return false
	}
	var walk func(c Chain, name string)
	walk = func(c Chain, name string) {
		if _, ok := names[c]; ok {
			return
		}
		names[c] = name
		if ch := nat.Chains[c]; ch != nil {
			for _, r := range ch.Rules {
				if own(r.Jump) {
					walk(Chain(r.Jump), name)
				}
			}
		}
	}
	for _, c := range []Chain{ChainServices, ChainNodePorts} {
		if ch := nat.Chains[c]; ch != nil {
			for _, r := range ch.Rules {
				if own(r.Jump) && r.Comment != "" {
					name, _, _ := parseEntryComment(r.Comment)
					walk(Chain(r.Jump), name)
				}
			}
		}
	}
	return names
}

// deleteLegacyCounters deletes the per-endpoint nfacct objects an older
// release left, once Cleanup removed the rules that named them. They are
// deleted in the kernel's list order (the dump's), so each one is found
// at the head of the list instead of after a walk of the others.
func deleteLegacyCounters(acct nfacct.Interface) {
	if acct == nil {
		return
	}
	objs, err := acct.List()
	if err != nil {
		log.WithError(err).Debug("nfacct objects not listed")
		return
	}
	var names []string
	for _, o := range objs {
		if strings.HasPrefix(o.Name, legacyCounterPrefix) {
			names = append(names, o.Name)
		}
	}
	if err := acct.Delete(names...); err != nil {
		log.WithError(err).Warn("endpoint nfacct objects of an older release not deleted")
		return
	}
	if len(names) > 0 {
		log.WithField("objects", len(names)).Info("deleted the endpoint nfacct objects of an older release")
	}
}
