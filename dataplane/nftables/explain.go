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
	"time"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// snapshot is the live table as Explain reads it: rule text by chain, map
// elements, set timeouts and set elements. It is read over netlink (the
// real kernel, explain_netlink.go), from one "nft list table" or from
// knftables.Fake's state, never from what Sync rendered.
type snapshot struct {
	chains   map[string][]string
	elems    map[string][]snapElem // map or set name -> elements
	timeouts map[string]int        // set name -> timeout seconds
	// hairpinKeys caches the hairpin set's keys ("a . tcp . 8080 . a"),
	// filled on first use from elems: built per view, it cost 1.6 CPU-s
	// more at 1,000 Services and did not end at 10,000.
	hairpinKeys map[string]bool
}

type snapElem struct {
	key     []string
	value   string
	comment string
}

var (
	reGoto     = regexp.MustCompile(`^goto\s+"?([^"\s]+)"?$`)
	reDNAT     = regexp.MustCompile(`dnat (?:ip6? )?to (\S+)`)
	reNumgen   = regexp.MustCompile(`^numgen random mod (\d+) \. meta l4proto vmap @(\S+)$`)
	reAffinity = regexp.MustCompile(`^ip6? saddr @(\S+) goto (\S+)$`)
	reRanges   = regexp.MustCompile(`^ip6? saddr (?:\{ (.*) \}|([0-9a-f.:/]+)) goto (\S+)$`)
	reRange    = regexp.MustCompile(`^(\d+)(?:-(\d+))?$`)
	reComment  = regexp.MustCompile(`\s+comment\s+"([^"]*)"`)
	reTimeout  = regexp.MustCompile(`^timeout (\d+)([smhd])`)
	// reNumgenMap is the split of a port without affinity: DNAT through
	// its weight map ("lo-hi . tcp : 198.19.1.2 . 8080").
	reNumgenMap = regexp.MustCompile(`^meta l4proto (\S+) dnat (?:ip6? )?to numgen random mod (\d+) \. meta l4proto map @(\S+)$`)
)

// Explain implements dataplane.Dataplane: it reads the live table (over
// netlink, only what it follows), follows each entry point of the shared maps through the
// chains and weight maps, and computes each backend's share of new
// connections from the numgen ranges.
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	snap, err := p.snapshot(ctx)
	if err != nil || snap == nil {
		return nil, err
	}
	var nodeAddrs []string
	for _, e := range snap.elems[setNodePortIPs] {
		nodeAddrs = append(nodeAddrs, strings.Join(e.key, ""))
	}
	drops := map[string]string{} // entry key -> verdict in the filter maps
	for _, m := range []string{mapNoEndpointServices, mapNoEndpointNodePorts} {
		for _, e := range snap.elems[m] {
			drops[strings.Join(e.key, " . ")] = e.value
		}
	}
	var views []dataplane.ServiceView
	seen := map[string]bool{}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts} {
		for _, e := range snap.elems[m] {
			k := strings.Join(e.key, " . ")
			if seen[k] {
				continue // a filter element of an entry already followed
			}
			seen[k] = true
			v, err := p.viewOf(m, e)
			if err != nil {
				return nil, err
			}
			if v.Entry == dataplane.EntryNodePort {
				v.NodeAddresses = nodeAddrs
			}
			verdict := drops[k]
			switch {
			case m == mapNoEndpointServices || m == mapNoEndpointNodePorts:
				// Only refused or dropped.
				if strings.Contains(verdict, chainReject) || strings.Contains(verdict, chainRejectShare) {
					v.Reject, v.Policy = true, ""
				} else {
					v.Drop, v.Policy = true, dataplane.PolicyLocal
				}
			default:
				m := reGoto.FindStringSubmatch(e.value)
				if m == nil {
					v.Problems = append(v.Problems, fmt.Sprintf("unexpected map value %q", e.value))
					break
				}
				snap.follow(p, m[1], &v)
				if len(v.Backends) == 0 && verdict == "drop" {
					v.Drop = true
				}
				if v.RejectShare > 0 && verdict == "" {
					v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections leave the split without DNAT and are not refused", v.RejectShare))
				}
			}
			views = append(views, v)
		}
	}
	// Masquerading happens in fixed chains every marked connection passes:
	// without them hairpin and off-cluster connections keep their source,
	// which no share shows, so every forwarded view carries the problem.
	if problem := snap.masqueradeProblem(); problem != "" {
		for i := range views {
			if len(views[i].Backends) > 0 {
				views[i].Problems = append(views[i].Problems, problem)
			}
		}
	}
	dataplane.SortViews(views)
	return views, nil
}

// masqueradeProblem reports what is missing for marked connections to be
// masqueraded: nat postrouting jumping to the masquerading chain, which
// masquerades and marks what the hairpin set matches, and the chain that
// sets the mark.
func (s *snapshot) masqueradeProblem() string {
	has := func(chain, what string) bool {
		for _, r := range s.chains[chain] {
			if strings.Contains(r, what) {
				return true
			}
		}
		return false
	}
	switch {
	case !has(chainNATPostrouting, "jump "+chainMasquerading):
		return "hairpin: nat postrouting does not jump to " + chainMasquerading + ": marked connections are not masqueraded"
	case !has(chainMasquerading, "masquerade"):
		return "hairpin: chain " + chainMasquerading + " does not masquerade: marked connections keep their source"
	case !has(chainMasquerading, "@"+setHairpin+" jump "+chainMarkMasq):
		return "hairpin: chain " + chainMasquerading + " does not match @" + setHairpin + ": pods reaching themselves are not masqueraded"
	case !has(chainMarkMasq, "meta mark set"):
		return "hairpin: chain " + chainMarkMasq + " sets no mark: connections are not marked for masquerading"
	}
	return ""
}

// viewOf starts the view of a shared map element.
func (p *Proxier) viewOf(m string, e snapElem) (dataplane.ServiceView, error) {
	v := dataplane.ServiceView{Backends: []dataplane.BackendView{}, Entry: dataplane.EntryClusterIP, Policy: dataplane.PolicyCluster}
	v.Service = e.comment
	for _, k := range []string{kindNodePort, kindExternalIP, kindLoadBalancer} {
		if s, ok := strings.CutSuffix(e.comment, k); ok {
			v.Service = s
			v.Entry = map[string]string{kindNodePort: dataplane.EntryNodePort, kindExternalIP: dataplane.EntryExternalIP, kindLoadBalancer: dataplane.EntryLoadBalancer}[k]
		}
	}
	key := e.key
	if m == mapServiceNodePorts || m == mapNoEndpointNodePorts {
		key = append([]string{dataplane.AnyAddr(p.cfg.Family)}, key...)
	}
	if len(key) != 3 {
		return v, fmt.Errorf("nftables: unexpected element key %q in %s", e.key, m)
	}
	ip, err := netip.ParseAddr(key[0])
	if err != nil {
		return v, fmt.Errorf("nftables: element key %q: %w", e.key, err)
	}
	port, err := strconv.ParseUint(key[2], 10, 16)
	if err != nil {
		return v, fmt.Errorf("nftables: element key %q: %w", e.key, err)
	}
	v.VIP, v.Port, v.Protocol = ip.String(), uint16(port), dataplane.Protocol(strings.ToUpper(key[1]))
	return v, nil
}

// follow walks chain as a new connection from off the cluster does: rules
// that only match pods (@cluster-cidrs) or the node itself (fib saddr type
// local) are skipped; an unconditional goto is followed; a source-range
// goto records the ranges and is followed; a numgen split ends the walk.
func (s *snapshot) follow(p *Proxier, chain string, v *dataplane.ServiceView) {
	for depth := 0; depth < 4; depth++ {
		rules, ok := s.chains[chain]
		if !ok {
			v.Problems = append(v.Problems, "missing chain "+chain)
			return
		}
		next := ""
		for _, r := range rules {
			if strings.Contains(r, "@"+setClusterCIDRs+" goto") || strings.HasPrefix(r, "fib saddr type local") {
				continue
			}
			if m := reRanges.FindStringSubmatch(r); m != nil {
				list := m[1] + m[2]
				for _, x := range strings.Split(list, ",") {
					x = strings.TrimSpace(x)
					if a, err := netip.ParseAddr(x); err == nil {
						x = netip.PrefixFrom(a, a.BitLen()).String() // nft prints /32 as an address
					}
					v.SourceRanges = append(v.SourceRanges, x)
				}
				next = m[3]
				break
			}
			if m := reGoto.FindStringSubmatch(r); m != nil {
				next = m[1]
				break
			}
			if m := reAffinity.FindStringSubmatch(r); m != nil {
				v.AffinitySeconds = s.timeouts[m[1]]
				continue
			}
			if m := reNumgen.FindStringSubmatch(r); m != nil {
				if strings.HasPrefix(chain, svlPrefix) {
					v.Policy = dataplane.PolicyLocal
				}
				s.split(p, m[1], m[2], v)
				return
			}
			if m := reNumgenMap.FindStringSubmatch(r); m != nil {
				if strings.HasPrefix(chain, svlPrefix) {
					v.Policy = dataplane.PolicyLocal
				}
				s.splitDNAT(m[1], m[2], m[3], v)
				return
			}
		}
		if next == "" {
			if strings.HasPrefix(chain, extPrefix) {
				v.Policy = dataplane.PolicyLocal // nothing for off-cluster clients
			}
			return
		}
		if strings.HasPrefix(chain, extPrefix) && strings.HasPrefix(next, svlPrefix) {
			v.Policy = dataplane.PolicyLocal
		}
		chain = next
	}
	v.Problems = append(v.Problems, "chains nest too deep at "+chain)
}

// split computes the shares of a weight map: each element "lo-hi . proto"
// takes (hi-lo+1)/mod of the connections.
func (s *snapshot) split(p *Proxier, modText, m string, v *dataplane.ServiceView) {
	mod, err := strconv.ParseUint(modText, 10, 32)
	if err != nil || mod == 0 {
		v.Problems = append(v.Problems, "unreadable modulus "+modText)
		return
	}
	shares := map[string]uint64{}
	var order []string
	var covered uint64
	for _, e := range s.elems[m] {
		r := reRange.FindStringSubmatch(e.key[0])
		g := reGoto.FindStringSubmatch(e.value)
		if r != nil && e.value == "return" {
			// The reject share (ServicePort.RejectWeight): no DNAT here,
			// refused by the filter map.
			g = []string{"", ""}
		}
		if r == nil || g == nil {
			v.Problems = append(v.Problems, fmt.Sprintf("unreadable weight element %q : %q", e.key, e.value))
			continue
		}
		lo, hi, ok := numgenRange(r, mod)
		if !ok {
			continue
		}
		if _, ok := shares[g[1]]; !ok {
			order = append(order, g[1])
		}
		shares[g[1]] += hi - lo + 1
		covered += hi - lo + 1
	}
	if covered < mod {
		v.Problems = append(v.Problems, fmt.Sprintf("%.4f%% of new connections match no weight range", 100*float64(mod-covered)/float64(mod)))
	}
	for _, ep := range order {
		if ep == "" {
			v.RejectShare = dataplane.RoundShare(100 * float64(shares[ep]) / float64(mod))
			continue
		}
		addr, hairpin := s.endpoint(ep)
		if !addr.IsValid() {
			v.Problems = append(v.Problems, "endpoint chain "+ep+" has no DNAT")
			continue
		}
		if !hairpin {
			v.Problems = append(v.Problems, "endpoint "+addr.String()+": hairpin connections are not masqueraded")
		}
		v.Backends = append(v.Backends, dataplane.BackendView{IP: addr.Addr().String(), Port: addr.Port(), Share: dataplane.RoundShare(100 * float64(shares[ep]) / float64(mod))})
	}
}

// splitDNAT computes the shares of a DNAT map: each element "lo-hi . proto :
// address . port" takes (hi-lo+1)/mod of the connections; what no element
// covers is the reject share (not DNATed, refused by the filter map).
// Each backend must be in the hairpin set (masqueradeProblem checks the
// rule that matches it).
func (s *snapshot) splitDNAT(proto, modText, m string, v *dataplane.ServiceView) {
	mod, err := strconv.ParseUint(modText, 10, 32)
	if err != nil || mod == 0 {
		v.Problems = append(v.Problems, "unreadable modulus "+modText)
		return
	}
	shares := map[netip.AddrPort]uint64{}
	var order []netip.AddrPort
	var covered uint64
	for _, e := range s.elems[m] {
		r := reRange.FindStringSubmatch(e.key[0])
		var to netip.AddrPort
		if f := strings.Split(e.value, " . "); len(f) == 2 {
			a, err1 := netip.ParseAddr(strings.TrimSpace(f[0]))
			port, err2 := strconv.ParseUint(strings.TrimSpace(f[1]), 10, 16)
			if err1 == nil && err2 == nil {
				to = netip.AddrPortFrom(a, uint16(port))
			}
		}
		if r == nil || !to.IsValid() {
			v.Problems = append(v.Problems, fmt.Sprintf("unreadable weight element %q : %q", e.key, e.value))
			continue
		}
		lo, hi, ok := numgenRange(r, mod)
		if !ok {
			continue
		}
		if _, ok := shares[to]; !ok {
			order = append(order, to)
		}
		shares[to] += hi - lo + 1
		covered += hi - lo + 1
	}
	if covered < mod {
		v.RejectShare = dataplane.RoundShare(100 * float64(mod-covered) / float64(mod))
	}
	if s.hairpinKeys == nil {
		s.hairpinKeys = map[string]bool{}
		for _, e := range s.elems[setHairpin] {
			s.hairpinKeys[strings.Join(e.key, " . ")] = true
		}
	}
	for _, to := range order {
		a := to.Addr().String()
		if !s.hairpinKeys[a+" . "+proto+" . "+strconv.Itoa(int(to.Port()))+" . "+a] {
			v.Problems = append(v.Problems, "endpoint "+to.String()+": hairpin connections are not masqueraded")
		}
		v.Backends = append(v.Backends, dataplane.BackendView{IP: a, Port: to.Port(), Share: dataplane.RoundShare(100 * float64(shares[to]) / float64(mod))})
	}
}

// endpoint returns an endpoint chain's DNAT target and whether it marks
// hairpin connections for masquerade.
func (s *snapshot) endpoint(chain string) (netip.AddrPort, bool) {
	var addr netip.AddrPort
	hairpin := false
	for _, r := range s.chains[chain] {
		if strings.Contains(r, "jump "+chainMarkMasq) && strings.Contains(r, "saddr") {
			hairpin = true
		}
		if m := reDNAT.FindStringSubmatch(r); m != nil {
			if a, err := netip.ParseAddrPort(m[1]); err == nil {
				addr = a
			}
		}
	}
	return addr, hairpin
}

// snapshot reads the live table; nil when there is none.
func (p *Proxier) snapshot(ctx context.Context) (*snapshot, error) {
	if f, ok := p.nft.(*knftables.Fake); ok {
		return fakeSnapshot(f), nil
	}
	if p.netlink != nil {
		// The real kernel: only what explain follows, over netlink
		// (explain_netlink.go), not a listing of every chain.
		return netlinkSnapshot(p.cfg.Family)
	}
	return p.nftSnapshot(ctx)
}

// nftSnapshot reads the table with one "nft list table".
func (p *Proxier) nftSnapshot(ctx context.Context) (*snapshot, error) {
	if !p.textRules {
		return nil, errors.New("nftables: explain needs the nft binary or knftables.Fake")
	}
	out, err := exec.CommandContext(ctx, "nft", "list", "table", string(p.f.nfFamily), TableName).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && strings.Contains(string(ee.Stderr), "No such file or directory") {
			return nil, nil
		}
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("nftables: nft list table: %w", err)
	}
	return parseTable(string(out)), nil
}

func fakeSnapshot(f *knftables.Fake) *snapshot {
	if f.Table == nil {
		return nil
	}
	s := &snapshot{chains: map[string][]string{}, elems: map[string][]snapElem{}, timeouts: map[string]int{}}
	for name, c := range f.Table.Chains {
		rules := []string{}
		for _, r := range c.Rules {
			rules = append(rules, strings.TrimSpace(r.Rule))
		}
		s.chains[name] = rules
	}
	conv := func(es []*knftables.Element) []snapElem {
		var out []snapElem
		for _, e := range es {
			x := snapElem{key: splitKey(e.Key), value: strings.TrimSpace(strings.Join(e.Value, " . "))}
			if e.Comment != nil {
				x.comment = *e.Comment
			}
			out = append(out, x)
		}
		return out
	}
	for name, m := range f.Table.Maps {
		s.elems[name] = conv(m.Elements)
	}
	for name, st := range f.Table.Sets {
		s.elems[name] = conv(st.Elements)
		if st.Timeout != nil {
			s.timeouts[name] = int(*st.Timeout / time.Second)
		}
	}
	return s
}

// parseTable reads the text of "nft list table": each chain's rules
// (comments cut off), each map's and set's elements, and set timeouts.
func parseTable(text string) *snapshot {
	s := &snapshot{chains: map[string][]string{}, elems: map[string][]snapElem{}, timeouts: map[string]int{}}
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "chain ") && strings.HasSuffix(l, "{"):
			name := strings.Trim(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(l, "chain "), "{")), `"`)
			rules := []string{}
			for i++; i < len(lines); i++ {
				r := strings.TrimSpace(lines[i])
				if r == "}" {
					break
				}
				if r == "" || strings.HasPrefix(r, "type ") || strings.HasPrefix(r, "comment ") {
					continue
				}
				rules = append(rules, strings.TrimSpace(reComment.ReplaceAllString(r, "")))
			}
			s.chains[name] = rules
		case (strings.HasPrefix(l, "map ") || strings.HasPrefix(l, "set ")) && strings.HasSuffix(l, "{"):
			name := strings.Trim(strings.TrimSpace(strings.TrimSuffix(l[4:], "{")), `"`)
			var body []string
			for i++; i < len(lines); i++ {
				r := strings.TrimSpace(lines[i])
				if r == "}" {
					break
				}
				body = append(body, r)
			}
			text := strings.Join(body, " ")
			for _, b := range body {
				if m := reTimeout.FindStringSubmatch(b); m != nil {
					n, _ := strconv.Atoi(m[1])
					s.timeouts[name] = n * map[string]int{"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]
				}
			}
			if _, list, ok := strings.Cut(text, "elements = {"); ok {
				list = strings.TrimSpace(list[:strings.LastIndex(list, "}")])
				s.elems[name] = parseElements(list)
			}
		}
	}
	return s
}

// parseElements splits "k1 comment "c" : v1, k2 : v2" (comments never
// hold commas: they are Service port names).
func parseElements(list string) []snapElem {
	var out []snapElem
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		var e snapElem
		if m := reComment.FindStringSubmatch(" " + item); m != nil {
			e.comment = m[1]
			item = strings.TrimSpace(reComment.ReplaceAllString(" "+item, ""))
		}
		key := item
		if k, v, ok := strings.Cut(item, " : "); ok {
			key, e.value = strings.TrimSpace(k), strings.TrimSpace(v)
		}
		e.key = splitKey([]string{key})
		out = append(out, e)
	}
	return out
}

// numgenRange reads a weight element's "lo" or "lo-hi" (reRange's match)
// clamped to the numgen modulus; ok is false for an empty range.
func numgenRange(r []string, mod uint64) (lo, hi uint64, ok bool) {
	lo, _ = strconv.ParseUint(r[1], 10, 64)
	hi = lo
	if r[2] != "" {
		hi, _ = strconv.ParseUint(r[2], 10, 64)
	}
	hi = min(hi, mod-1)
	return lo, hi, hi >= lo
}
