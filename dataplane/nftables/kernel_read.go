package nftables

import (
	"bytes"
	"cmp"
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
	// The hairpin set is the biggest read (100,000 elements at 10,000
	// Services x 10 endpoints: 0.39-0.42 CPU-s, 0.37-0.39 of it in the
	// kernel, against 0.17-0.27 for the rules' dump; docs/data/
	// explain-2026-12-07b/phases.txt), so it and the shared maps are
	// read on a socket of their own while the rules are dumped and
	// decoded and the weight maps read: on two idle cores the wall time
	// is the longer of the two, not their sum. A set that is not there
	// reads as none, as when the table is missing.
	bg := newLiveTable()
	bgDone := make(chan error, 1)
	go func() { bgDone <- readNodeSets(f, r.alen, bg) }()
	bgErr := func() error {
		err, ok := <-bgDone
		if ok {
			close(bgDone)
		}
		return err
	}
	defer bgErr() //nolint:errcheck // only waits: never leave the reader running
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
	if err := r.readWeightMaps(t); err != nil {
		return nil, err
	}
	if err := bgErr(); err != nil {
		return nil, err
	}
	t.shared, t.hairpin, t.nodeIPs = bg.shared, bg.hairpin, bg.nodeIPs
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

// readNodeSets reads into t, over a socket of its own, the shared maps
// (with their comments, which name the Service ports), the node port
// addresses and the hairpin set; a set that is not there reads as none.
// Each element is decoded where it was received: a hairpin element
// becomes its key in t.hairpin and nothing else.
func readNodeSets(f fam, alen int, t *liveTable) error {
	c, err := netlinkDial()
	if err != nil {
		return err
	}
	defer c.Close()
	family := byte(f.nfproto())
	read := func(name string, fn func(*rawElem) error) error {
		if err := eachElem(c, family, name, fn); err != nil && !isNotFound(err) {
			return fmt.Errorf("nftables: elements of %s: %w", name, err)
		}
		return nil
	}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts} {
		err := read(m, func(e *rawElem) error {
			key, err := decodeSvcKey(m, e.key, alen)
			if err != nil {
				return err
			}
			to, err := decodeVerdict(e.val)
			if err != nil {
				return err
			}
			c := e.comment()
			t.shared[m] = append(t.shared[m], sharedElem{elem{m: m, key: key, to: to}, &c})
			return nil
		})
		if err != nil {
			return err
		}
	}
	err = read(setNodePortIPs, func(e *rawElem) error {
		if a, ok := netip.AddrFromSlice(e.key); ok && !e.intervalEnd {
			t.nodeIPs = append(t.nodeIPs, a)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The keys first, then the map at its size: no rehashing while
	// 100,000 keys arrive.
	var keys []hairpinKey
	err = read(setHairpin, func(e *rawElem) error {
		k, err := decodeHairpinKey(e.key, alen)
		keys = append(keys, k)
		return err
	})
	if err != nil {
		return err
	}
	t.hairpin = make(map[hairpinKey]bool, len(keys))
	for _, k := range keys {
		t.hairpin[k] = true
	}
	return nil
}

// readWeightMaps reads every weight map a rule draws from, over
// elemReaders sockets at once, each element decoded where it was
// received into a start or end point; each map's points become its
// ranges once all are read.
func (r *kernelReader) readWeightMaps(t *liveTable) error {
	var names []string
	for _, rules := range t.chains {
		for _, rl := range rules {
			for _, s := range rl {
				wm := &weightMap{}
				var name string
				switch x := s.(type) {
				case numgenVmap:
					name = x.m
				case numgenDNAT:
					name, wm.dnat = x.m, true
				default:
					continue
				}
				if _, done := t.weights[name]; done || r.sets[name] == nil {
					continue
				}
				if p, ok := rl[0].(l4proto); ok {
					wm.proto = uint8(p)
				}
				t.weights[name] = wm
				names = append(names, name)
			}
		}
	}
	wms := make([]*weightMap, len(names))
	pts := make([][]wmPoint, len(names))
	for i, name := range names {
		wms[i] = t.weights[name]
	}
	err := eachSetOf(byte(r.f.nfproto()), names, elemReaders, func(i int, e *rawElem) error {
		x, err := decodeWeightElem(e, wms[i].dnat, r.alen)
		if err != nil {
			return err
		}
		pts[i] = append(pts[i], x)
		return nil
	})
	if err != nil {
		return err
	}
	for i, wm := range wms {
		wm.elems = wmRanges(pts[i])
	}
	return nil
}

// wmPoint is one kernel element of a weight map: the start of a range
// (e holds its value) or, flagged, the end.
type wmPoint struct {
	key uint32
	end bool
	e   wmElem
}

// wmRanges turns a weight map's kernel elements into its ranges as the
// rbtree looks a draw up (the greatest element not above it; an end
// misses): a start at lo runs to the key of the next element minus one,
// an end or an adjacent range's start, or to the last draw when none
// follows. An end with nothing open before it (nft's end at 0) bounds
// nothing.
func wmRanges(pts []wmPoint) []wmElem {
	// By key, an end before a start of the same key (the end of the range
	// below it).
	slices.SortFunc(pts, func(a, b wmPoint) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(b2i(!a.end), b2i(!b.end))
	})
	out := make([]wmElem, 0, (len(pts)+1)/2)
	for i, p := range pts {
		if p.end {
			continue
		}
		x := p.e
		x.lo, x.hi = p.key, ^uint32(0)
		if i+1 < len(pts) {
			x.hi = pts[i+1].key - 1
		}
		out = append(out, x)
	}
	return out
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// decodeWeightElem reads a weight map's kernel element: key the draw
// (numgen's value big endian), the interval end flag, and a start's value,
// an endpoint (address, then the port in its register) or a verdict.
func decodeWeightElem(e *rawElem, dnat bool, alen int) (wmPoint, error) {
	if len(e.key) != 4 {
		return wmPoint{}, fmt.Errorf("key of %d bytes", len(e.key))
	}
	x := wmPoint{key: binary.BigEndian.Uint32(e.key), end: e.intervalEnd}
	if x.end {
		return x, nil
	}
	if dnat {
		if len(e.val) != alen+4 {
			return wmPoint{}, fmt.Errorf("value of %d bytes", len(e.val))
		}
		a, _ := netip.AddrFromSlice(e.val[:alen])
		x.e.dnat = netip.AddrPortFrom(a, binary.BigEndian.Uint16(e.val[alen:]))
		return x, nil
	}
	var err error
	x.e.to, err = decodeVerdict(e.val)
	return x, err
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
	// Only names without rules are collected: the verdicts name at least
	// one chain per Service, all but a few with rules.
	var names []string
	need := func(n string) {
		if _, ok := t.chains[n]; !ok && n != "" {
			names = append(names, n)
		}
	}
	for _, n := range []string{chainNATPostrouting, chainMasquerading, chainMarkMasq} {
		need(n)
	}
	for _, rules := range t.chains {
		for _, rl := range rules {
			if v, ok := rl.verdictOf(); ok && v.chain != "" {
				need(v.chain)
			}
		}
	}
	for _, es := range t.shared {
		for _, e := range es {
			need(e.e.to.chain)
		}
	}
	for _, wm := range t.weights {
		for _, e := range wm.elems {
			need(e.to.chain)
		}
	}
	for _, n := range names {
		if _, ok := t.chains[n]; ok {
			continue // named twice
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
