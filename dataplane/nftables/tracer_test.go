package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// The packet tracer: the unit tests' oracle. It walks a new connection
// through the rules and elements of the knftables Fake's table, from the
// base chains, as the kernel would: NAT prerouting (or output), the filter
// hook, NAT postrouting. Where a numgen lookup splits the connections it
// follows every range with its share. It reads only the shapes of rule
// steelyard writes and fails the test on anything else, so a rule it cannot
// follow is never taken as a match. It shares no code with the renderer or
// with Explain (kube-proxy's nftablesTracer is the model).

// tracer traces packets through one Fake table.
type tracer struct {
	t       testing.TB
	tab     *knftables.FakeTable
	nodeIPs []netip.Addr
}

func newTracer(t testing.TB, nft knftables.Interface, nodeIPs ...string) *tracer {
	t.Helper()
	fake, ok := nft.(*knftables.Fake)
	if !ok {
		t.Fatalf("tracer: %T is not the knftables Fake", nft)
	}
	tr := &tracer{t: t, tab: fake.Table}
	for _, a := range nodeIPs {
		tr.nodeIPs = append(tr.nodeIPs, netip.MustParseAddr(a))
	}
	if tr.tab == nil {
		t.Fatal("tracer: no table")
	}
	return tr
}

// pkt is the first packet of a new connection.
type pkt struct {
	src, dst netip.Addr
	proto    string // tcp, udp, sctp
	port     uint16
	// fromNode: sent by a process of the node (nat output, filter output).
	fromNode bool
}

// flow is one branch of a connection's way through the table.
type flow struct {
	share float64 // of the new connections, 0..1
	dst   netip.AddrPort
	dnat  bool
	mark  bool   // marked for masquerade
	masq  bool   // masqueraded
	end   string // "", or the verdict that ended it: accept, drop, reject
	path  []string
}

// traced is what new connections of one packet shape meet.
type traced struct {
	endpoints map[netip.AddrPort]float64 // share in percent
	masq      map[netip.AddrPort]bool
	reject    float64 // percent
	drop      float64
	pass      float64 // neither DNATed nor refused
}

// shares are the endpoints' shares keyed "address:port".
func (o traced) shares() map[string]float64 {
	out := map[string]float64{}
	for ap, s := range o.endpoints {
		out[ap.String()] = s
	}
	return out
}

func (o traced) String() string {
	var parts []string
	for _, ap := range sortedAddrPorts(o.endpoints) {
		parts = append(parts, fmt.Sprintf("%s %.4f%% masq=%v", ap, o.endpoints[ap], o.masq[ap]))
	}
	return fmt.Sprintf("%s reject %.4f%% drop %.4f%% pass %.4f%%", strings.Join(parts, ", "), o.reject, o.drop, o.pass)
}

func sortedAddrPorts[V any](m map[netip.AddrPort]V) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return out
}

// trace follows p through the hooks.
func (tr *tracer) trace(p pkt) traced {
	tr.t.Helper()
	nat, filter := chainNATPrerouting, chainFilterForward
	if p.fromNode {
		nat, filter = chainNATOutput, chainFilterOutput
	}
	out := traced{endpoints: map[netip.AddrPort]float64{}, masq: map[netip.AddrPort]bool{}}
	seen := map[netip.AddrPort]bool{}
	start := flow{share: 1, dst: netip.AddrPortFrom(p.dst, p.port)}
	for _, f := range tr.hook(nat, p, start) {
		fc := filter
		if !p.fromNode && tr.isNode(f.dst.Addr()) {
			fc = chainFilterInput
		}
		for _, g := range tr.hook(fc, p, f) {
			if g.end == "accept" && fc == chainFilterInput && tr.tab.Chains[chainLocalnetInput] != nil {
				// The localnet chain is another base chain of the input hook.
				for _, h := range tr.hook(chainLocalnetInput, p, g) {
					tr.account(&out, seen, p, h)
				}
				continue
			}
			tr.account(&out, seen, p, g)
		}
	}
	return out
}

// account ends flow f: NAT postrouting for what passed the filter.
func (tr *tracer) account(out *traced, seen map[netip.AddrPort]bool, p pkt, f flow) {
	switch f.end {
	case "drop":
		out.drop += 100 * f.share
		return
	case "reject":
		out.reject += 100 * f.share
		return
	}
	fs := tr.hook(chainNATPostrouting, p, f)
	for _, g := range fs {
		switch {
		case g.end == "drop" || g.end == "reject":
			tr.t.Errorf("tracer: %s in nat postrouting: %v", g.end, g.path)
		case !g.dnat:
			out.pass += 100 * g.share
		default:
			out.endpoints[g.dst] += 100 * g.share
			if m, ok := out.masq[g.dst]; seen[g.dst] && ok && m != g.masq {
				tr.t.Errorf("tracer: connections to %s masqueraded in one branch, not in another", g.dst)
			}
			seen[g.dst] = true
			out.masq[g.dst] = g.masq
		}
	}
}

func (tr *tracer) isNode(a netip.Addr) bool {
	return slices.Contains(tr.nodeIPs, a) || a.IsLoopback()
}

// hook runs a base chain; the flows it lets through end in "accept".
func (tr *tracer) hook(chain string, p pkt, f flow) []flow {
	f.end = ""
	if tr.tab.Chains[chain] == nil {
		f.end = "accept"
		return []flow{f}
	}
	fs := tr.run(chain, 0, p, f, 0)
	for i := range fs {
		if fs[i].end == "" {
			fs[i].end = "accept" // the base chain's policy
		}
	}
	return fs
}

// branch is a rule's outcome for one flow: act is "" (go on with the next
// rule), "jump C", "goto C", "return", "drop", "reject" or "accept".
type branch struct {
	f   flow
	act string
}

// run runs chain from rule i on; the flows that come back with end ""
// returned (or fell off the chain's end).
func (tr *tracer) run(chain string, i int, p pkt, f flow, depth int) []flow {
	if depth > 16 {
		tr.t.Errorf("tracer: jumps too deep at %s: %v", chain, f.path)
		return nil
	}
	ch := tr.tab.Chains[chain]
	if ch == nil {
		tr.t.Errorf("tracer: no chain %s (from %v)", chain, f.path)
		return nil
	}
	for ; i < len(ch.Rules); i++ {
		bs := tr.rule(ch.Rules[i].Rule, p, f)
		if len(bs) == 1 && bs[0].act == "" {
			f = bs[0].f
			continue
		}
		var out []flow
		for _, b := range bs {
			b.f.path = append(slices.Clip(b.f.path), chain+": "+ch.Rules[i].Rule)
			verb, target, _ := strings.Cut(b.act, " ")
			switch verb {
			case "":
				out = append(out, tr.run(chain, i+1, p, b.f, depth)...)
			case "jump":
				for _, g := range tr.run(target, 0, p, b.f, depth+1) {
					if g.end != "" {
						out = append(out, g)
					} else {
						out = append(out, tr.run(chain, i+1, p, g, depth)...)
					}
				}
			case "goto":
				out = append(out, tr.run(target, 0, p, b.f, depth+1)...)
			case "return":
				out = append(out, b.f)
			default:
				b.f.end = verb
				out = append(out, b.f)
			}
		}
		return out
	}
	return []flow{f}
}

// rule evaluates one rule's text for flow f.
func (tr *tracer) rule(text string, p pkt, f flow) []branch {
	miss := []branch{{f, ""}}
	s := strings.TrimSpace(text)
	ip := "ip"
	if p.dst.Is6() {
		ip = "ip6"
	}
	take := func(prefix string) bool {
		if s == prefix || strings.HasPrefix(s, prefix+" ") {
			s = strings.TrimSpace(s[len(prefix):])
			return true
		}
		return false
	}
	// word takes the next word.
	word := func() string {
		w, rest, _ := strings.Cut(s, " ")
		s = strings.TrimSpace(rest)
		return w
	}
	// braces takes "{ a, b }".
	braces := func() []string {
		inner, rest, ok := strings.Cut(strings.TrimPrefix(s, "{"), "}")
		if !ok {
			tr.t.Fatalf("tracer: unterminated set in %q", text)
		}
		s = strings.TrimSpace(rest)
		var out []string
		for _, x := range strings.Split(inner, ",") {
			out = append(out, strings.TrimSpace(x))
		}
		return out
	}
	for s != "" {
		switch {
		case take("ct state new"), take("ct state != { established, related }"):
			// a new connection
		case take("ct state invalid"):
			// the tracer follows new connections, never invalid ones
			return miss
		case take("ct status & dnat == 0"):
			if f.dnat {
				return miss
			}
		case take("ct status dnat"):
			if !f.dnat {
				return miss
			}
		case take(ip + " daddr . meta l4proto . th dport . " + ip + " saddr"):
			set := strings.TrimPrefix(word(), "@")
			key := []string{f.dst.Addr().String(), p.proto, strconv.Itoa(int(f.dst.Port())), p.src.String()}
			if tr.setHas(set, key) == nil {
				return miss
			}
		case take(ip + " daddr . meta l4proto . th dport vmap"):
			e := tr.mapGet(strings.TrimPrefix(word(), "@"), []string{f.dst.Addr().String(), p.proto, strconv.Itoa(int(f.dst.Port()))})
			if e == nil {
				return miss
			}
			return []branch{{f, strings.Join(e.Value, " ")}}
		case take("meta l4proto . th dport vmap"):
			e := tr.mapGet(strings.TrimPrefix(word(), "@"), []string{p.proto, strconv.Itoa(int(f.dst.Port()))})
			if e == nil {
				return miss
			}
			return []branch{{f, strings.Join(e.Value, " ")}}
		case strings.HasPrefix(s, ip+" saddr ") || strings.HasPrefix(s, ip+" daddr "):
			a := p.src
			if strings.HasPrefix(s, ip+" daddr ") {
				a = f.dst.Addr()
			}
			word()
			word()
			not := take("!=")
			var in bool
			switch {
			case strings.HasPrefix(s, "@"):
				in = tr.addrInSet(strings.TrimPrefix(word(), "@"), a)
			case strings.HasPrefix(s, "{"):
				in = containsAny(tr.t, braces(), a)
			default:
				in = containsAny(tr.t, []string{word()}, a)
			}
			if in == not {
				return miss
			}
		case strings.HasPrefix(s, "tcp dport ") || strings.HasPrefix(s, "udp dport ") || strings.HasPrefix(s, "sctp dport "):
			proto := word()
			word()
			if proto != p.proto || word() != strconv.Itoa(int(f.dst.Port())) {
				return miss
			}
		case take("meta l4proto"):
			if word() != p.proto {
				return miss
			}
		case take("fib saddr type local"):
			if !tr.isNode(p.src) {
				return miss
			}
		case take("numgen random mod"):
			mod, off, m, verb := tr.numgen(&s, word, text)
			return tr.split(mod, off, m, p, f, verb, text)
		case take("dnat " + ip + " to numgen random mod"):
			mod, off, m, verb := tr.numgen(&s, word, text)
			return tr.split(mod, off, m, p, f, verb, text)
		case take("dnat to"):
			ap := netip.MustParseAddrPort(word())
			f.dst, f.dnat = ap, true
		case take("update"):
			word()
			braces() // the affinity set: the tracer's connections are new
		case take("meta mark set meta mark |"):
			word()
			f.mark = true
		case take("meta mark set meta mark ^"):
			word()
			f.mark = false
		case take("meta mark &"):
			word()
			if !take("== 0") {
				tr.t.Fatalf("tracer: cannot read %q", text)
			}
			if f.mark {
				return miss
			}
		case take("masquerade fully-random"), take("masquerade"):
			f.masq = true
			return []branch{{f, "accept"}}
		case take("reject with tcp reset"), take("reject"):
			return []branch{{f, "reject"}}
		case take("drop"):
			return []branch{{f, "drop"}}
		case take("return"):
			return []branch{{f, "return"}}
		case take("accept"):
			return []branch{{f, "accept"}}
		case strings.HasPrefix(s, "jump ") || strings.HasPrefix(s, "goto "):
			verb := word()
			return []branch{{f, verb + " " + word()}}
		default:
			tr.t.Fatalf("tracer: cannot read %q in rule %q", s, text)
		}
	}
	return []branch{{f, ""}}
}

// numgen reads "N [offset K] vmap @m" or "... map @m".
func (tr *tracer) numgen(s *string, word func() string, text string) (uint64, uint64, string, string) {
	mod, err := strconv.ParseUint(word(), 10, 64)
	var off uint64
	verb := word()
	if err == nil && verb == "offset" {
		off, err = strconv.ParseUint(word(), 10, 32)
		verb = word()
	}
	if err != nil || (verb != "map" && verb != "vmap") {
		tr.t.Fatalf("tracer: cannot read the numgen of %q", text)
	}
	m := strings.TrimPrefix(word(), "@")
	if *s != "" {
		tr.t.Fatalf("tracer: %q after the numgen lookup of %q", *s, text)
	}
	return mod, off, m, verb
}

// fieldsOf splits a key or value however the Fake holds it.
func fieldsOf(k []string) []string {
	var out []string
	for _, x := range k {
		for _, y := range strings.Split(x, " . ") {
			out = append(out, strings.TrimSpace(y))
		}
	}
	return out
}

func (tr *tracer) mapGet(m string, key []string) *knftables.Element {
	fm := tr.tab.Maps[m]
	if fm == nil {
		tr.t.Errorf("tracer: no map %s", m)
		return nil
	}
	for _, e := range fm.Elements {
		if slices.Equal(fieldsOf(e.Key), key) {
			return e
		}
	}
	return nil
}

func (tr *tracer) setHas(set string, key []string) *knftables.Element {
	fs := tr.tab.Sets[set]
	if fs == nil {
		tr.t.Errorf("tracer: no set %s", set)
		return nil
	}
	for _, e := range fs.Elements {
		if slices.Equal(fieldsOf(e.Key), key) {
			return e
		}
	}
	return nil
}

func (tr *tracer) addrInSet(set string, a netip.Addr) bool {
	fs := tr.tab.Sets[set]
	if fs == nil {
		tr.t.Errorf("tracer: no set %s", set)
		return false
	}
	for _, e := range fs.Elements {
		if containsAny(tr.t, fieldsOf(e.Key), a) {
			return true
		}
	}
	return false
}

// containsAny: a is one of the addresses or in one of the prefixes.
func containsAny(t testing.TB, xs []string, a netip.Addr) bool {
	for _, x := range xs {
		if strings.Contains(x, "/") {
			if netip.MustParsePrefix(x).Contains(a) {
				return true
			}
			continue
		}
		b, err := netip.ParseAddr(x)
		if err != nil {
			t.Fatalf("tracer: address %q", x)
		}
		if a == b {
			return true
		}
	}
	return false
}

// The clients of the traced views: off the cluster (in the source ranges
// of the tests' load balancers) and a pod.
var (
	offCluster4 = netip.MustParseAddr("198.19.128.5")
	offCluster6 = netip.MustParseAddr("2001:2::ff:5")
)

// tracedViews are the views of s's entry points as the tracer finds them
// for a client off the cluster: dataplane.Expected's views with their
// backends, shares, reject and drop replaced by what the traced
// connections meet. Diff against Expected compares exactly those.
func tracedViews(t testing.TB, tr *tracer, s dataplane.State) []dataplane.ServiceView {
	t.Helper()
	views := dataplane.Expected(s)
	out := make([]dataplane.ServiceView, 0, len(views))
	for _, v := range views {
		dst := netip.MustParseAddr(v.VIP)
		if v.Entry == dataplane.EntryNodePort {
			dst = netip.Addr{}
			for _, a := range tr.nodeIPs {
				if a.Is4() == (v.VIP == "0.0.0.0") {
					dst = a
				}
			}
			if !dst.IsValid() {
				t.Fatalf("tracer: no node address for %s", v.Line())
			}
		}
		src := offCluster4
		if dst.Is6() {
			src = offCluster6
		}
		o := tr.trace(pkt{src: src, dst: dst, proto: v.Protocol.Lower(), port: v.Port})
		w := v
		w.Backends, w.Reject, w.Drop, w.RejectShare, w.Problems = []dataplane.BackendView{}, false, false, 0, nil
		for _, ap := range sortedAddrPorts(o.endpoints) {
			w.Backends = append(w.Backends, dataplane.BackendView{IP: ap.Addr().String(), Port: ap.Port(), Share: dataplane.RoundShare(o.endpoints[ap])})
		}
		switch {
		case len(w.Backends) == 0 && o.reject > 99.9999:
			w.Reject = true
		case len(w.Backends) == 0 && o.drop > 99.9999:
			w.Drop = true
		default:
			w.RejectShare = dataplane.RoundShare(o.reject)
			if o.drop > 0 {
				w.Problems = append(w.Problems, fmt.Sprintf("%.4f%% dropped", o.drop))
			}
		}
		if o.pass > 0 {
			w.Problems = append(w.Problems, fmt.Sprintf("%.4f%% passed without DNAT", o.pass))
		}
		out = append(out, w)
	}
	dataplane.SortViews(out)
	return out
}

// wantTraced fails t unless the tracer finds s served as desired, and
// finds no entry point in the table's maps that s does not have.
func wantTraced(t testing.TB, what string, nft knftables.Interface, s dataplane.State, nodeIPs ...string) {
	t.Helper()
	tr := newTracer(t, nft, nodeIPs...)
	want := dataplane.Expected(s)
	if diff := dataplane.Diff(want, tracedViews(t, tr, s)); len(diff) > 0 {
		t.Errorf("%s: the tracer disagrees with the desired state:\n%s", what, strings.Join(diff, "\n"))
	}
	entries := map[string]bool{}
	for _, v := range want {
		k := strings.Join([]string{v.VIP, v.Protocol.Lower(), strconv.Itoa(int(v.Port))}, " ")
		if v.Entry == dataplane.EntryNodePort {
			k = strings.Join([]string{v.Protocol.Lower(), strconv.Itoa(int(v.Port))}, " ")
		}
		entries[k] = true
	}
	for _, m := range []string{mapServiceIPs, mapNoEndpointServices, mapServiceNodePorts, mapNoEndpointNodePorts} {
		if fm := tr.tab.Maps[m]; fm != nil {
			for _, e := range fm.Elements {
				if k := strings.Join(fieldsOf(e.Key), " "); !entries[k] {
					t.Errorf("%s: map %s has %s, not in the desired state", what, m, k)
				}
			}
		}
	}
}

// wantServed judges p's table with the tracer (the node's addresses from
// p.NodeAddresses); against the real nft (STEELYARD_NFT_REAL=1, no Fake)
// with Explain.
func wantServed(t testing.TB, what string, p *Proxier, s dataplane.State) {
	t.Helper()
	fake := fakeOf(p.nft)
	if fake == nil {
		live, err := p.Explain()
		if err != nil {
			t.Fatal(err)
		}
		if diff := dataplane.Diff(dataplane.Expected(s), live); len(diff) > 0 {
			t.Errorf("%s: explain disagrees with the desired state:\n%s", what, strings.Join(diff, "\n"))
		}
		return
	}
	var nodeIPs []string
	if p.NodeAddresses != nil {
		for _, a := range p.NodeAddresses() {
			nodeIPs = append(nodeIPs, a.String())
		}
	}
	wantTraced(t, what, fake, s, nodeIPs...)
}

// wantMasquerade checks with the tracer who is masqueraded at each entry
// point of s (IPv4, the tests' cluster CIDRs, no MasqueradeAll): a client
// off the cluster at the clusterIP (unless internalTrafficPolicy Local)
// and at every external entry under a Cluster policy; a pod at the
// external entries under a Cluster policy only. And a client outside a
// load balancer's source ranges is dropped there.
func wantMasquerade(t testing.TB, tr *tracer, s dataplane.State) {
	t.Helper()
	pod := netip.MustParseAddr("198.19.1.250")
	for _, v := range dataplane.Expected(s) {
		if len(v.Backends) == 0 {
			continue
		}
		var sp *dataplane.ServicePort
		for i := range s.Services {
			if s.Services[i].Name.String() == v.Service {
				sp = &s.Services[i]
			}
		}
		dst := netip.MustParseAddr(v.VIP)
		if v.Entry == dataplane.EntryNodePort {
			dst = tr.nodeIPs[0]
		}
		external := v.Entry != dataplane.EntryClusterIP
		for _, c := range []struct {
			who  string
			src  netip.Addr
			want bool
		}{
			{"a client off the cluster", offCluster4, (!external && !sp.InternalLocal) || (external && !sp.ExternalLocal)},
			{"a pod", pod, external && !sp.ExternalLocal},
		} {
			if c.src == pod && len(v.SourceRanges) > 0 {
				continue // not in the ranges: dropped, checked below
			}
			o := tr.trace(pkt{src: c.src, dst: dst, proto: v.Protocol.Lower(), port: v.Port})
			if len(o.endpoints) == 0 {
				t.Errorf("%s from %s: no endpoint reached: %v", v.Line(), c.who, o)
			}
			for ap, m := range o.masq {
				if m != c.want {
					t.Errorf("%s from %s: to %s masqueraded %v, want %v", v.Line(), c.who, ap, m, c.want)
				}
			}
		}
		if v.Entry == dataplane.EntryLoadBalancer && len(v.SourceRanges) > 0 {
			o := tr.trace(pkt{src: netip.MustParseAddr("198.19.129.5"), dst: dst, proto: v.Protocol.Lower(), port: v.Port})
			if o.drop != 100 {
				t.Errorf("%s from outside its source ranges: %v, want dropped", v.Line(), o)
			}
		}
	}
}
