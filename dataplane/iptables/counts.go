package iptables

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Counting new connections per endpoint (issue 23). The DNAT rule of each
// endpoint chain names an nfacct object, "sy-ep-" and the chain's hash:
// nat rules see only the first packet of a connection, so the object's
// packet count is the endpoint's count of new connections. A rule's own
// counter would not do: iptables-restore resets it whenever the chain is
// rewritten. The object is created before the restore that first names it
// (a missing one fails the restore) and deleted after the one that removes
// the chain; its count survives every rewrite in between (weights change
// only the split chain) and agent restarts.

// counterPrefix starts the name of every endpoint counter.
const counterPrefix = "sy-ep-"

// EndpointCounter is the nfacct object of endpoint chain sep: 20
// characters, under nfacct's 31.
func EndpointCounter(sep Chain) string {
	return counterPrefix + strings.TrimPrefix(string(sep), sepPrefix)
}

// counting reports whether endpoint rules name their counter.
func (c Config) counting() bool { return c.CountConnections && c.NFAcct != nil }

// ensureEndpointCounters creates the counters of the endpoint chains a
// restore writes; existing ones keep their counts.
func (p *Proxier) ensureEndpointCounters(chains []Chain) error {
	if !p.cfg.counting() {
		return nil
	}
	for _, c := range chains {
		if !strings.HasPrefix(string(c), sepPrefix) {
			continue
		}
		if err := p.cfg.NFAcct.Ensure(EndpointCounter(c)); err != nil {
			return fmt.Errorf("connection counting (--count-connections) needs nfacct: %w", err)
		}
	}
	return nil
}

// deleteEndpointCounters deletes the counters of endpoint chains a
// restore removed: in a Sync while counting, and in Cleanup (counters
// left by a run that counted; turning counting off leaves them until
// then). A failure is logged only: the count stays behind,
// unused, and goes at the next removal or cleanup.
func (p *Proxier) deleteEndpointCounters(chains []Chain) {
	if p.cfg.NFAcct == nil {
		return
	}
	for _, c := range chains {
		if !strings.HasPrefix(string(c), sepPrefix) {
			continue
		}
		if err := p.cfg.NFAcct.Delete(EndpointCounter(c)); err != nil {
			log.WithError(err).WithField("chain", c).Debug("endpoint counter not deleted")
		}
	}
}

// Counts implements dataplane.Dataplane: the counter of each endpoint
// chain's DNAT rule, read from the live rules and one nfacct dump. Rules without a
// counter (counting off) give no count.
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	rs, err := p.liveRuleset()
	if err != nil {
		return nil, err
	}
	nat := rs.Tables[TableNAT]
	if nat == nil {
		return nil, nil
	}
	if p.cfg.NFAcct == nil {
		return nil, nil
	}
	objs, err := p.cfg.NFAcct.List()
	if err != nil {
		return nil, err
	}
	packets := make(map[string]uint64, len(objs))
	for _, o := range objs {
		packets[o.Name] = o.Packets
	}
	var out []dataplane.EndpointCount
	for _, c := range nat.Order {
		if !strings.HasPrefix(string(c), sepPrefix) {
			continue
		}
		for _, r := range nat.Chains[c].Rules {
			if r.NFAcct == "" || r.Jump != "DNAT" {
				continue
			}
			ep, err := netip.ParseAddrPort(r.TargetArgs["--to-destination"])
			if err != nil {
				return nil, fmt.Errorf("chain %s: DNAT to %q: %w", c, r.TargetArgs["--to-destination"], err)
			}
			n, ok := packets[r.NFAcct]
			if !ok {
				continue // removed between the save and the list
			}
			out = append(out, dataplane.EndpointCount{Service: r.Comment, Protocol: dataplane.Protocol(strings.ToUpper(r.Protocol)), Endpoint: ep, NewConnections: n})
		}
	}
	return dataplane.MergeCounts(out), nil
}
