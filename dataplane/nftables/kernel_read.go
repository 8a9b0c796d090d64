package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// liveTable is the table as Explain reads it, in the model's types: each
// chain's rules as statements (model_decode.go), the shared maps'
// elements, the weight maps the rules draw from, the hairpin and node
// port sets and the affinity sets' timeouts. The one snapshot Explain
// works from: read from the kernel by readKernel, and in unit tests from
// the knftables Fake by a test helper.
type liveTable struct {
	// chains holds every chain read; a chain that exists without rules
	// has a nil entry.
	chains   map[string][]rule
	shared   map[string][]sharedElem
	weights  map[string]*weightMap
	hairpin  map[hairpinKey]bool
	nodeIPs  []netip.Addr
	timeouts map[string]int
}

func newLiveTable() *liveTable {
	return &liveTable{chains: map[string][]rule{}, shared: map[string][]sharedElem{}, weights: map[string]*weightMap{},
		hairpin: map[hairpinKey]bool{}, timeouts: map[string]int{}}
}

// readKernel reads family's table with google/nftables (and one rule dump,
// netlink_dump.go); nil when there is no table. A commit in the middle of
// the reads (the generation moved) makes it read again, so the snapshot
// is of one ruleset.
func readKernel(family int) (*liveTable, error) {
	for try := 0; ; try++ {
		gen0, gerr0 := readGeneration()
		t, err := readKernelOnce(family)
		gen1, gerr1 := readGeneration()
		if err != nil || gerr0 != nil || gerr1 != nil || gen0 == gen1 || try == 2 {
			return t, err
		}
	}
}

// kernelReader reads one table over one lasting google/nftables
// connection (sets, chains) and a plain socket (elements,
// netlink_elems.go).
type kernelReader struct {
	c     *gnft.Conn
	nc    *nlConn
	f     fam
	table *gnft.Table
	sets  map[string]*gnft.Set
	alen  int
	anon  map[string][]netip.Prefix
	err   error // the first failed read of an anonymous set
}

func readKernelOnce(family int) (*liveTable, error) {
	f := famOf(family)
	r := &kernelReader{f: f, table: &gnft.Table{Name: TableName, Family: gnft.TableFamilyIPv4}, alen: 4, anon: map[string][]netip.Prefix{}}
	if f.v6 {
		r.table.Family, r.alen = gnft.TableFamilyIPv6, 16
	}
	c, err := gnft.New(gnft.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables: netlink: %w", err)
	}
	defer c.CloseLasting() //nolint:errcheck // read-only
	r.c = c
	if r.nc, err = netlinkDial(); err != nil {
		return nil, err
	}
	defer r.nc.Close()
	sets, err := c.GetSets(r.table)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nftables: get sets: %w", err)
	}
	t := newLiveTable()
	r.sets = make(map[string]*gnft.Set, len(sets))
	for _, s := range sets {
		r.sets[s.Name] = s
		if s.Timeout > 0 && !s.Anonymous {
			t.timeouts[s.Name] = int(s.Timeout / time.Second)
		}
	}
	rules, err := dumpRules(f)
	if err != nil {
		return nil, err
	}
	for _, rr := range rules {
		es, err := decodeExprs(byte(f.nfproto()), rr.exprs)
		if err != nil {
			return nil, fmt.Errorf("nftables: rule of %s: %w", rr.chain, err)
		}
		t.chains[rr.chain] = append(t.chains[rr.chain], decodeRule(f, es, r.ranges))
	}
	if r.err != nil {
		return nil, r.err
	}
	if err := r.readElements(t); err != nil {
		return nil, err
	}
	return t, r.chainsWithoutRules(t)
}

// elements reads a set's elements (nil when it is not there).
func (r *kernelReader) elements(name string) ([]gnft.SetElement, error) {
	if r.sets[name] == nil {
		return nil, nil
	}
	es, err := dumpElems(r.nc, byte(r.f.nfproto()), name)
	if err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("nftables: elements of %s: %w", name, err)
	}
	return es, nil
}

// readElements reads the shared maps, the node's sets and every weight map
// a rule draws from.
func (r *kernelReader) readElements(t *liveTable) error {
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts} {
		es, err := r.elements(m)
		if err != nil {
			return err
		}
		for _, e := range es {
			key, err := decodeSvcKey(m, e.Key, r.alen)
			if err != nil {
				return err
			}
			to, err := decodeVerdict(e.Val)
			if err != nil {
				return fmt.Errorf("map %s: %w", m, err)
			}
			c := e.Comment
			t.shared[m] = append(t.shared[m], sharedElem{elem{m: m, key: key, to: to}, &c})
		}
	}
	es, err := r.elements(setNodePortIPs)
	if err != nil {
		return err
	}
	for _, e := range es {
		if a, ok := netip.AddrFromSlice(e.Key); ok && !e.IntervalEnd {
			t.nodeIPs = append(t.nodeIPs, a)
		}
	}
	if es, err = r.elements(setHairpin); err != nil {
		return err
	}
	for _, e := range es {
		k, err := decodeHairpinKey(e.Key, r.alen)
		if err != nil {
			return err
		}
		t.hairpin[k] = true
	}
	type use struct {
		dnat  bool
		proto uint8
	}
	uses := map[string]use{}
	var names []string
	for _, rules := range t.chains {
		for _, rl := range rules {
			for _, s := range rl {
				var name string
				var u use
				switch x := s.(type) {
				case numgenVmap:
					name = x.m
				case numgenDNAT:
					name, u.dnat = x.m, true
				default:
					continue
				}
				if _, done := uses[name]; done || r.sets[name] == nil {
					continue
				}
				if p, ok := rl[0].(l4proto); ok {
					u.proto = uint8(p)
				}
				uses[name] = u
				names = append(names, name)
			}
		}
	}
	elems, err := dumpElemsOf(byte(r.f.nfproto()), names, elemReaders)
	if err != nil {
		return err
	}
	for i, name := range names {
		wm, err := decodeWeightMap(name, uses[name].dnat, uses[name].proto, r.alen, elems[i])
		if err != nil {
			return err
		}
		t.weights[name] = wm
	}
	return nil
}

// decodeWeightMap reads a weight map's elements: keys "lo-hi . proto"
// (numgen's value big endian, each field in its register), values an
// endpoint (address, then the port in its register) or a verdict.
func decodeWeightMap(name string, dnat bool, proto uint8, alen int, es []gnft.SetElement) (*weightMap, error) {
	var err error
	wm := &weightMap{dnat: dnat, proto: proto}
	if len(es) > 0 {
		wm.elems = make([]wmElem, 0, len(es))
	}
	for _, e := range es {
		if len(e.Key) != 8 || (e.KeyEnd != nil && len(e.KeyEnd) != 8) {
			return nil, fmt.Errorf("nftables: map %s: key of %d bytes", name, len(e.Key))
		}
		x := wmElem{lo: binary.BigEndian.Uint32(e.Key)}
		x.hi = x.lo
		if e.KeyEnd != nil {
			x.hi = binary.BigEndian.Uint32(e.KeyEnd)
		}
		if dnat {
			if len(e.Val) != alen+4 {
				return nil, fmt.Errorf("nftables: map %s: value of %d bytes", name, len(e.Val))
			}
			a, _ := netip.AddrFromSlice(e.Val[:alen])
			x.dnat = netip.AddrPortFrom(a, binary.BigEndian.Uint16(e.Val[alen:]))
		} else if x.to, err = decodeVerdict(e.Val); err != nil {
			return nil, fmt.Errorf("nftables: map %s: %w", name, err)
		}
		wm.elems = append(wm.elems, x)
	}
	return wm, nil
}

// ranges returns the prefixes of an anonymous interval set (a source
// range list), read once; false for a named set.
func (r *kernelReader) ranges(name string) ([]netip.Prefix, bool) {
	s := r.sets[name]
	if s == nil || !s.Anonymous {
		return nil, false
	}
	if ps, ok := r.anon[name]; ok {
		return ps, true
	}
	es, err := r.elements(name)
	if err != nil && r.err == nil {
		r.err = err
	}
	// An interval set holds each range as its first address and, flagged
	// as the end, the address after its last.
	slices.SortFunc(es, func(a, b gnft.SetElement) int { return bytes.Compare(a.Key, b.Key) })
	var out []netip.Prefix
	var lo netip.Addr
	for _, e := range es {
		a, ok := netip.AddrFromSlice(e.Key)
		switch {
		case !ok:
		case !e.IntervalEnd:
			lo = a
		case lo.IsValid():
			out = append(out, rangePrefixes(lo, a.Prev())...)
			lo = netip.Addr{}
		}
	}
	if lo.IsValid() { // open to the end of the address space
		last := netip.IPv4Unspecified().Prev()
		if lo.Is6() {
			last = netip.IPv6Unspecified().Prev()
		}
		out = append(out, rangePrefixes(lo, last)...)
	}
	r.anon[name] = out
	return out, true
}

// chainsWithoutRules gives an empty entry to each chain that a verdict
// names, or that Explain reads, and that exists without rules (the rule
// dump does not show it); one lookup by name each.
func (r *kernelReader) chainsWithoutRules(t *liveTable) error {
	names := []string{chainNATPostrouting, chainMasquerading, chainMarkMasq}
	for _, rules := range t.chains {
		for _, rl := range rules {
			if v, ok := rl.verdictOf(); ok && v.chain != "" {
				names = append(names, v.chain)
			}
		}
	}
	for _, es := range t.shared {
		for _, e := range es {
			names = append(names, e.e.to.chain)
		}
	}
	for _, wm := range t.weights {
		for _, e := range wm.elems {
			names = append(names, e.to.chain)
		}
	}
	for _, n := range names {
		if _, ok := t.chains[n]; ok || n == "" {
			continue
		}
		if _, err := r.c.ListChain(r.table, n); err != nil {
			if isNotFound(err) {
				continue // missing: Explain reports it
			}
			return fmt.Errorf("nftables: chain %s: %w", n, err)
		}
		t.chains[n] = nil
	}
	return nil
}

// decodeHairpinKey reads a hairpin set key: "address . proto . port .
// address", each field in its register.
func decodeHairpinKey(k []byte, alen int) (hairpinKey, error) {
	if len(k) != 2*alen+8 {
		return hairpinKey{}, fmt.Errorf("set %s: key of %d bytes", setHairpin, len(k))
	}
	a, _ := netip.AddrFromSlice(k[:alen])
	if _, ok := protoNames[k[alen]]; !ok {
		return hairpinKey{}, fmt.Errorf("set %s: protocol %d", setHairpin, k[alen])
	}
	return newHairpinKey(a, k[alen], binary.BigEndian.Uint16(k[alen+4:])), nil
}

// rawRule is one rule of the dump: its chain and NFTA_RULE_EXPRESSIONS.
type rawRule struct {
	chain string
	exprs []byte
}

// dumpRules reads every rule of the table in one dump.
func dumpRules(f fam) ([]rawRule, error) {
	c, err := netlinkDial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	replies, err := c.get(uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETRULE), true, byte(f.nfproto()),
		[]nlAttr{{unix.NFTA_RULE_TABLE, append([]byte(TableName), 0)}})
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nftables: get rules: %w", err)
	}
	out := make([]rawRule, 0, len(replies))
	for _, b := range replies {
		out = append(out, rawRule{chain: strings.TrimRight(string(attrGet(b, unix.NFTA_RULE_CHAIN)), "\x00"), exprs: attrGet(b, unix.NFTA_RULE_EXPRESSIONS)})
	}
	return out, nil
}
