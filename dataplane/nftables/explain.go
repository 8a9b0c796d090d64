package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

var (
	reNumgen = regexp.MustCompile(`^numgen random mod (\d+) < (\d+) goto\s+"?([^"\s]+)"?$`)
	reGoto   = regexp.MustCompile(`^goto\s+"?([^"\s]+)"?$`)
	reDNAT   = regexp.MustCompile(`dnat (?:ip6? )?to (\S+)`)
)

// Explain implements dataplane.Dataplane: it reads the live table back (the
// service-ips map, each Service chain's numgen ranges and each endpoint
// chain's DNAT) and computes each backend's share of new connections.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	if _, err := p.nft.List(ctx, "chains"); err != nil {
		if knftables.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nftables: %w", err)
	}
	p.chainRules = nil
	if p.textRules {
		rules, err := p.listText(ctx)
		if err != nil {
			return nil, err
		}
		p.chainRules = rules
	}
	defer func() { p.chainRules = nil }()
	var views []dataplane.ServiceView
	elems, err := p.nft.ListElements(ctx, "map", mapServiceIPs)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, fmt.Errorf("nftables: list %s: %w", mapServiceIPs, err)
	}
	for _, e := range elems {
		v, err := p.viewOf(e)
		if err != nil {
			return nil, err
		}
		if len(e.Value) != 1 {
			v.Problems = append(v.Problems, fmt.Sprintf("unexpected map value %q", e.Value))
			views = append(views, v)
			continue
		}
		m := reGoto.FindStringSubmatch(strings.TrimSpace(e.Value[0]))
		if m == nil {
			v.Problems = append(v.Problems, fmt.Sprintf("unexpected map value %q", e.Value[0]))
			views = append(views, v)
			continue
		}
		if err := p.readService(ctx, m[1], &v); err != nil {
			return nil, err
		}
		views = append(views, v)
	}
	rejects, err := p.nft.ListElements(ctx, "set", setNoEndpoints)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, fmt.Errorf("nftables: list %s: %w", setNoEndpoints, err)
	}
	for _, e := range rejects {
		v, err := p.viewOf(e)
		if err != nil {
			return nil, err
		}
		v.Reject = true
		v.Policy = ""
		views = append(views, v)
	}
	dataplane.SortViews(views)
	return views, nil
}

// viewOf starts the view of a map or set element "VIP . proto . port".
func (p *Proxier) viewOf(e *knftables.Element) (dataplane.ServiceView, error) {
	key := e.Key
	if len(key) == 1 {
		key = strings.Split(key[0], " . ")
	}
	if len(key) != 3 {
		return dataplane.ServiceView{}, fmt.Errorf("nftables: unexpected element key %q", e.Key)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(key[0]))
	if err != nil {
		return dataplane.ServiceView{}, fmt.Errorf("nftables: element key %q: %w", e.Key, err)
	}
	port, err := strconv.ParseUint(strings.TrimSpace(key[2]), 10, 16)
	if err != nil {
		return dataplane.ServiceView{}, fmt.Errorf("nftables: element key %q: %w", e.Key, err)
	}
	v := dataplane.ServiceView{
		VIP:      ip.String(),
		Port:     uint16(port),
		Protocol: dataplane.Protocol(strings.ToUpper(strings.TrimSpace(key[1]))),
		Backends: []dataplane.BackendView{},
		Entry:    dataplane.EntryClusterIP,
		Policy:   dataplane.PolicyCluster,
	}
	if e.Comment != nil {
		v.Service = *e.Comment
	}
	return v, nil
}

// readService fills v from a Service chain: arms "numgen random mod R <
// c goto EP", each taking c/R of what reaches it, then a last "goto EP"
// taking the rest.
func (p *Proxier) readService(ctx context.Context, chain string, v *dataplane.ServiceView) error {
	rules, err := p.rules(ctx, chain)
	if err != nil {
		return fmt.Errorf("nftables: list chain %s: %w", chain, err)
	}
	left := 1.0 // the fraction of new connections reaching the rule
	shares := map[string]float64{}
	var order []string
	add := func(ep string, share float64) {
		if _, ok := shares[ep]; !ok {
			order = append(order, ep)
		}
		shares[ep] += share
	}
	ended := false
	for _, r := range rules {
		if v.Service == "" && r.Comment != nil {
			v.Service = *r.Comment
		}
		text := strings.TrimSpace(r.Rule)
		if m := reGoto.FindStringSubmatch(text); m != nil {
			add(m[1], left)
			left, ended = 0, true
			break
		}
		if m := reNumgen.FindStringSubmatch(text); m != nil {
			mod, _ := strconv.ParseFloat(m[1], 64)
			below, _ := strconv.ParseFloat(m[2], 64)
			if mod <= 0 || below > mod {
				v.Problems = append(v.Problems, "unreadable draw: "+text)
				continue
			}
			add(m[3], left*below/mod)
			left *= 1 - below/mod
		}
	}
	if len(order) == 0 {
		v.Problems = append(v.Problems, "Service chain "+chain+" sends no connection anywhere")
		return nil
	}
	if !ended && left > 1e-9 {
		v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections fall through the Service chain", 100*left))
	}
	for _, ep := range order {
		addr, hairpin, err := p.readEndpoint(ctx, ep)
		if err != nil {
			return err
		}
		if !addr.IsValid() {
			v.Problems = append(v.Problems, "endpoint chain "+ep+" has no DNAT")
			continue
		}
		if !hairpin {
			v.Problems = append(v.Problems, "endpoint "+addr.String()+": hairpin connections are not masqueraded")
		}
		v.Backends = append(v.Backends, dataplane.BackendView{
			IP: addr.Addr().String(), Port: addr.Port(), Share: dataplane.RoundShare(100 * shares[ep]),
		})
	}
	return nil
}

// readEndpoint returns an endpoint chain's DNAT target and whether it marks
// hairpin connections for masquerade.
func (p *Proxier) readEndpoint(ctx context.Context, chain string) (netip.AddrPort, bool, error) {
	rules, err := p.rules(ctx, chain)
	if err != nil {
		return netip.AddrPort{}, false, fmt.Errorf("nftables: list chain %s: %w", chain, err)
	}
	var addr netip.AddrPort
	hairpin := false
	for _, r := range rules {
		if strings.Contains(r.Rule, "jump "+chainMarkMasq) && strings.Contains(r.Rule, "saddr") {
			hairpin = true
		}
		if m := reDNAT.FindStringSubmatch(r.Rule); m != nil {
			a, err := netip.ParseAddrPort(m[1])
			if err == nil {
				addr = a
			}
		}
	}
	return addr, hairpin, nil
}

// rules returns a chain's rules as text: from the table listing read at the
// start of Explain (real nft: its JSON rules carry no text), else from the
// Interface (knftables.Fake keeps the text).
func (p *Proxier) rules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	if p.chainRules != nil {
		rules, ok := p.chainRules[chain]
		if !ok {
			return nil, fmt.Errorf("no such chain")
		}
		return rules, nil
	}
	return p.nft.ListRules(ctx, chain)
}

var reComment = regexp.MustCompile(`\s+comment\s+"([^"]*)"\s*$`)

// listText reads "nft list table" and returns the rules of each chain.
func (p *Proxier) listText(ctx context.Context) (map[string][]*knftables.Rule, error) {
	out, err := exec.CommandContext(ctx, "nft", "list", "table", string(p.f.nfFamily), TableName).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("nftables: nft list table: %w", err)
	}
	return parseTable(string(out)), nil
}

// parseTable splits the text of "nft list table" into chains and rules.
func parseTable(text string) map[string][]*knftables.Rule {
	out := map[string][]*knftables.Rule{}
	chain, inChain, depth := "", false, 0
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		switch {
		case depth == 1 && strings.HasPrefix(l, "chain ") && strings.HasSuffix(l, "{"):
			chain = strings.Trim(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "chain "), "{")), `"`)
			inChain = true
			out[chain] = []*knftables.Rule{}
		case strings.HasSuffix(l, "{"):
			// table, map, set blocks
		case l == "}":
			if depth == 2 {
				inChain = false
			}
		case inChain && depth == 2 && l != "" && !strings.HasPrefix(l, "type ") && !strings.HasPrefix(l, "policy ") && !strings.HasPrefix(l, "comment "):
			r := &knftables.Rule{Chain: chain, Rule: l}
			if m := reComment.FindStringSubmatch(l); m != nil {
				c := m[1]
				r.Comment = &c
				r.Rule = strings.TrimSpace(l[:len(l)-len(m[0])])
			}
			out[chain] = append(out[chain], r)
		}
		depth += strings.Count(l, "{") - strings.Count(l, "}")
	}
	return out
}
