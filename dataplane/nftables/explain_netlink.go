package nftables

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The explain snapshot read over netlink. "nft list table" of a
// 10,000-Service table costs 10-17 CPU-s, almost all of it the kernel's
// chain and rule dumps, which restart from the first chain for every
// netlink message they fill (docs/benchmarks.md). Explain needs neither
// every chain nor a dump of them: it starts at the shared maps and follows
// verdicts. So this reads the table's sets with one dump, the elements of
// the shared maps, then the rules of each chain a verdict names, chain by
// chain (the kernel finds a named chain through its hash, no dump restart),
// and the elements of each set a rule looks up; each chain and set once.
// The rules are printed as nft 1.0.6 lists them (explain's regexes read
// that text); an expression sequence the printer does not know prints as
// "unknown: ..." so that explain reports it instead of guessing a share.
//
// Rules are decoded here, not with google/nftables' GetRules: that drops
// expressions it has no type for and cannot decode byteorder, so an
// unknown expression would vanish from the text instead of showing. The
// socket is a plain blocking one (nlConn): at 10,000 Services the reads
// are 120,000 requests, and mdlayher/netlink's peek before every receive
// and its allocations doubled the snapshot's CPU (12.0 against 6.7 CPU-s).
// What is left is mostly the kernel finding each weight map by name in
// the table's list of sets for its element dump (perf: about half).

// Attribute numbers x/sys/unix does not name.
const (
	nftaSetElemKeyEnd   = 10   // NFTA_SET_ELEM_KEY_END
	nftSetConcat        = 0x80 // NFT_SET_CONCAT
	nftaListElem        = 1    // NFTA_LIST_ELEM
	nftaBitwiseOp       = 6    // NFTA_BITWISE_OP (shifts)
	natRangeMapIPs      = 1    // NF_NAT_RANGE_MAP_IPS
	natRangeProtoSpec   = 2    // NF_NAT_RANGE_PROTO_SPECIFIED
	natRangeRandomFully = 0x10 // NF_NAT_RANGE_PROTO_RANDOM_FULLY
	udataRuleComment    = 0    // NFTNL_UDATA_RULE_COMMENT
	udataSetElemComment = 0    // NFTNL_UDATA_SET_ELEM_COMMENT
	verdictMagic        = 0xffffff00
)

// nft data types (nft's enum datatypes), as set key and data types.
const (
	typeInteger  = 4
	typeIPAddr   = 7
	typeIP6Addr  = 8
	typeInetProt = 12
	typeInetServ = 13
	typeMark     = 19
)

// nlSet is a set or map of the table as the kernel describes it.
type nlSet struct {
	name              string
	flags             uint32
	keyType, dataType uint32
	keyLen, dataLen   uint32
	timeoutMS         uint64
	hasTimeout        bool
	userdata          []byte
}

func (s *nlSet) isMap() bool      { return s.flags&unix.NFT_SET_MAP != 0 }
func (s *nlSet) anonymous() bool  { return s.flags&unix.NFT_SET_ANONYMOUS != 0 }
func (s *nlSet) interval() bool   { return s.flags&unix.NFT_SET_INTERVAL != 0 }
func (s *nlSet) dynamic() bool    { return s.flags&unix.NFT_SET_EVAL != 0 }
func (s *nlSet) verdictMap() bool { return s.isMap() && s.dataType == verdictMagic }
func (s *nlSet) concatFlag() bool { return s.flags&nftSetConcat != 0 }

// numgenTypeof reports a "typeof numgen ..." key: nft keeps the typeof
// expressions in the set's user data, numgen as expression type 23 (a
// TLV: type 0, length 4, the type in host order). Its integer field is
// numgen's value, which nft turns to network order.
func (s *nlSet) numgenTypeof() bool {
	return bytes.Contains(s.userdata, binary.NativeEndian.AppendUint32([]byte{0, 4}, 23))
}

// nlElem is one element as the kernel dumps it.
type nlElem struct {
	key, keyEnd []byte
	data        []byte // NFTA_DATA_VALUE content
	verdict     []byte // NFTA_DATA_VERDICT content
	flags       uint32
	comment     string
	// packets is the element's counter (a set with "counter"; counts.go),
	// counted tells it has one.
	packets uint64
	counted bool
}

// nlExpr is one expression of a rule: its name and its attributes.
type nlExpr struct {
	name  string
	attrs attrs
}

// attr is one netlink attribute; attrs a list of them.
type attr struct {
	typ uint16
	val []byte
}

type attrs []attr

// get returns the value of the attribute of type t (nil: none).
func (a attrs) get(t uint16) []byte {
	for _, x := range a {
		if x.typ == t {
			return x.val
		}
	}
	return nil
}

func (e nlExpr) u32(t uint16) (uint32, bool) {
	b := e.attrs.get(t)
	if len(b) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(b), true
}

// only reports whether e has no attribute outside allowed.
func (e nlExpr) only(allowed ...uint16) bool {
	for _, a := range e.attrs {
		if !slices.Contains(allowed, a.typ) {
			return false
		}
	}
	return true
}

// nested parses the attributes in b (netlink attributes: length and
// type in host order, the value padded to 4 bytes).
func nested(b []byte) (attrs, error) { return appendAttrs(make(attrs, 0, 8), b) }

func appendAttrs(out attrs, b []byte) (attrs, error) {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < 4 || n > len(b) {
			return nil, errors.New("nftables: bad netlink attribute")
		}
		out = append(out, attr{t, b[4:n:n]})
		b = b[min((n+3)&^3, len(b)):]
	}
	return out, nil
}

// attrGet returns the value of the first attribute of type t in b
// without parsing the others into a list (nil: none, or malformed).
func attrGet(b []byte, t uint16) []byte {
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil
		}
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == t {
			return b[4:n:n]
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return nil
}

// list returns the NFTA_LIST_ELEM payloads of a nested list.
func list(b []byte) ([][]byte, error) {
	out := make([][]byte, 0, 8)
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil, errors.New("nftables: bad netlink attribute")
		}
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == nftaListElem {
			out = append(out, b[4:n:n])
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return out, nil
}

// decodeExprs reads NFTA_RULE_EXPRESSIONS.
func decodeExprs(b []byte) ([]nlExpr, error) { return new(exprDecoder).decode(b) }

// exprDecoder decodes rules into buffers it reuses: a rule's expressions
// are valid until the next decode. At 10,000 Services (220,000 rules)
// fresh slices per expression were most of the snapshot's garbage, which
// an agent's 300 MiB heap makes expensive to collect.
type exprDecoder struct {
	exprs []nlExpr
	attrs attrs
}

// exprNames interns expression names (no string per expression).
var exprNames = map[string]string{}

func init() {
	for _, n := range []string{"payload", "cmp", "meta", "lookup", "immediate", "nat", "numgen", "byteorder", "dynset", "fib", "ct", "bitwise", "counter", "masq", "reject"} {
		exprNames[n] = n
	}
}

func (d *exprDecoder) decode(b []byte) ([]nlExpr, error) {
	d.exprs, d.attrs = d.exprs[:0], d.attrs[:0]
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		if n < 4 || n > len(b) {
			return nil, errors.New("nftables: bad netlink attribute")
		}
		if binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER) == nftaListElem {
			it := b[4:n]
			raw := bytes.TrimRight(attrGet(it, unix.NFTA_EXPR_NAME), "\x00")
			name, ok := exprNames[string(raw)]
			if !ok {
				name = string(raw)
			}
			start := len(d.attrs)
			var err error
			if d.attrs, err = appendAttrs(d.attrs, attrGet(it, unix.NFTA_EXPR_DATA)); err != nil {
				return nil, err
			}
			d.exprs = append(d.exprs, nlExpr{name: name, attrs: d.attrs[start:len(d.attrs):len(d.attrs)]})
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	return d.exprs, nil
}

// decodeExpr reads one expression: NFTA_EXPR_NAME and NFTA_EXPR_DATA.
func decodeExpr(b []byte) (nlExpr, error) {
	e := nlExpr{name: strings.TrimRight(string(attrGet(b, unix.NFTA_EXPR_NAME)), "\x00")}
	if d := attrGet(b, unix.NFTA_EXPR_DATA); d != nil {
		var err error
		if e.attrs, err = nested(d); err != nil {
			return nlExpr{}, err
		}
	}
	return e, nil
}

// dataValue returns the NFTA_DATA_VALUE or NFTA_DATA_VERDICT content of
// a data attribute (cmp, immediate, bitwise, set element data).
func dataValue(b []byte) (value, verdict []byte, err error) {
	return attrGet(b, unix.NFTA_DATA_VALUE), attrGet(b, unix.NFTA_DATA_VERDICT), nil
}

// nlReader reads one family's table over one netlink socket.
type nlReader struct {
	c      *nlConn
	nfProt byte // NFPROTO_IPV4 or NFPROTO_IPV6
	pr     printer
	sets   map[string]*nlSet
	elems  map[string][]nlElem // read so far
	snap   *snapshot
	queue  []string
	queued map[string]bool
	dec    exprDecoder
}

// netlinkSnapshot reads the table of family as Explain needs it; nil when
// there is no table. A commit in the middle of the reads (the generation
// moved) makes it read again, so the snapshot is of one ruleset.
func netlinkSnapshot(family int) (*snapshot, error) {
	c, err := netlinkDial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	for try := 0; ; try++ {
		gen0, gerr0 := readGeneration()
		s, err := readSnapshot(c, family)
		gen1, gerr1 := readGeneration()
		if err != nil || gerr0 != nil || gerr1 != nil || gen0 == gen1 || try == 2 {
			return s, err
		}
	}
}

func readSnapshot(c *nlConn, family int) (*snapshot, error) {
	r := &nlReader{c: c, nfProt: unix.NFPROTO_IPV4, pr: printer{family: family}, elems: map[string][]nlElem{}, queued: map[string]bool{},
		snap: &snapshot{chains: map[string][]string{}, elems: map[string][]snapElem{}, timeouts: map[string]int{}}}
	if family == 6 {
		r.nfProt = unix.NFPROTO_IPV6
	}
	r.pr.set = r.set
	r.pr.elements = r.setElems
	if _, err := r.request(unix.NFT_MSG_GETTABLE, false, str(unix.NFTA_TABLE_NAME, TableName)); err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("nftables: get table: %w", err)
	}
	if err := r.readSets(); err != nil {
		return nil, err
	}
	for _, s := range r.sets {
		if s.hasTimeout && !s.anonymous() {
			r.snap.timeouts[s.name] = int(s.timeoutMS / 1000)
		}
	}
	// The maps and sets Explain starts from, then the fixed chains that
	// masqueradeProblem reads; every chain a verdict names follows.
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts, setNodePortIPs} {
		if err := r.readNamedSet(m); err != nil {
			return nil, err
		}
	}
	for _, c := range []string{chainNATPostrouting, chainMasquerading, chainMarkMasq} {
		r.enqueue(c)
	}
	for len(r.queue) > 0 {
		c := r.queue[0]
		r.queue = r.queue[1:]
		if err := r.readChain(c); err != nil {
			return nil, err
		}
	}
	return r.snap, nil
}

func (r *nlReader) enqueue(chain string) {
	if chain != "" && !r.queued[chain] {
		r.queued[chain] = true
		r.queue = append(r.queue, chain)
	}
}

// request sends one nf_tables GET (a dump when dump is set) with the
// attributes attrs and returns the replies' payloads (after nfgenmsg).
func (r *nlReader) request(msg int, dump bool, attrs ...attr) ([][]byte, error) {
	return r.c.get(uint16(unix.NFNL_SUBSYS_NFTABLES<<8|msg), dump, r.nfProt, attrs)
}

// str is a NUL-terminated string attribute.
func str(t uint16, s string) attr { return attr{t, append([]byte(s), 0)} }

func (r *nlReader) readSets() error {
	replies, err := r.request(unix.NFT_MSG_GETSET, true, str(unix.NFTA_SET_TABLE, TableName))
	if err != nil {
		return fmt.Errorf("nftables: get sets: %w", err)
	}
	r.sets = make(map[string]*nlSet, len(replies))
	for _, b := range replies {
		a, err := nested(b)
		if err != nil {
			return fmt.Errorf("nftables: get sets: %w", err)
		}
		s := &nlSet{name: strings.TrimRight(string(a.get(unix.NFTA_SET_NAME)), "\x00"), userdata: a.get(unix.NFTA_SET_USERDATA)}
		u := func(t uint16) uint32 {
			if v := a.get(t); len(v) == 4 {
				return binary.BigEndian.Uint32(v)
			}
			return 0
		}
		s.flags, s.keyType, s.keyLen, s.dataType, s.dataLen = u(unix.NFTA_SET_FLAGS), u(unix.NFTA_SET_KEY_TYPE), u(unix.NFTA_SET_KEY_LEN), u(unix.NFTA_SET_DATA_TYPE), u(unix.NFTA_SET_DATA_LEN)
		if v := a.get(unix.NFTA_SET_TIMEOUT); len(v) == 8 {
			s.timeoutMS, s.hasTimeout = binary.BigEndian.Uint64(v), true
		}
		r.sets[s.name] = s
	}
	return nil
}

func (r *nlReader) set(name string) *nlSet { return r.sets[name] }

// setElems returns the elements of a set, read once.
func (r *nlReader) setElems(name string) ([]nlElem, error) {
	if es, ok := r.elems[name]; ok {
		return es, nil
	}
	replies, err := r.request(unix.NFT_MSG_GETSETELEM, true, str(unix.NFTA_SET_ELEM_LIST_TABLE, TableName), str(unix.NFTA_SET_ELEM_LIST_SET, name))
	if err != nil {
		return nil, fmt.Errorf("nftables: elements of %s: %w", name, err)
	}
	var out []nlElem
	for _, b := range replies {
		a, err := nested(b)
		if err != nil {
			return nil, err
		}
		items, err := list(a.get(unix.NFTA_SET_ELEM_LIST_ELEMENTS))
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			ea := elemAttrs(it)
			var e nlElem
			if k := ea.get(unix.NFTA_SET_ELEM_KEY); k != nil {
				e.key, _, _ = dataValue(k)
			}
			if k := ea.get(nftaSetElemKeyEnd); k != nil {
				e.keyEnd, _, _ = dataValue(k)
			}
			if d := ea.get(unix.NFTA_SET_ELEM_DATA); d != nil {
				e.data, e.verdict, _ = dataValue(d)
			}
			if f := ea.get(unix.NFTA_SET_ELEM_FLAGS); len(f) == 4 {
				e.flags = binary.BigEndian.Uint32(f)
			}
			e.comment = udataString(ea.get(unix.NFTA_SET_ELEM_USERDATA), udataSetElemComment)
			e.packets, e.counted = elemCounter(ea)
			out = append(out, e)
		}
	}
	if s := r.sets[name]; s != nil && s.anonymous() {
		r.elems[name] = out // rules may share it; named sets are read once anyway
	}
	return out, nil
}

// readNamedSet puts a named set's elements, as nft prints them, into the
// snapshot and queues the chains its verdicts name. Sets the kernel fills
// (affinity: dynamic, with timeouts) are not read: Explain needs only
// their timeout, and their elements expire while one reads them.
func (r *nlReader) readNamedSet(name string) error {
	s := r.sets[name]
	if s == nil || s.anonymous() || s.dynamic() {
		return nil
	}
	if _, done := r.snap.elems[name]; done {
		return nil
	}
	es, err := r.setElems(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return err
	}
	out := r.pr.elements0(s, es)
	for _, e := range out {
		r.enqueue(verdictChain(e.value))
	}
	if len(out) > 0 {
		r.snap.elems[name] = out
	} else {
		r.snap.elems[name] = nil // read, empty (nft prints no elements)
	}
	return nil
}

// readChain reads one chain's rules, prints them and follows what they name.
func (r *nlReader) readChain(chain string) error {
	replies, err := r.request(unix.NFT_MSG_GETRULE, true, str(unix.NFTA_RULE_TABLE, TableName), str(unix.NFTA_RULE_CHAIN, chain))
	if err != nil {
		if isNotFound(err) {
			return nil // explain reports the missing chain
		}
		return fmt.Errorf("nftables: rules of %s: %w", chain, err)
	}
	rules := make([]string, 0, len(replies))
	for _, b := range replies {
		exprs, err := r.dec.decode(attrGet(b, unix.NFTA_RULE_EXPRESSIONS))
		if err != nil {
			return fmt.Errorf("nftables: rules of %s: %w", chain, err)
		}
		text, refs := r.pr.ruleText(exprs)
		for _, c := range refs.chains {
			r.enqueue(c)
		}
		for _, s := range refs.sets {
			if err := r.readNamedSet(s); err != nil {
				return err
			}
		}
		rules = append(rules, text)
	}
	r.snap.chains[chain] = rules
	return nil
}

// udataString returns the string of TLV type typ in nftnl user data
// (type byte, length byte, value with its NUL).
func udataString(b []byte, typ byte) string {
	for len(b) >= 2 {
		t, n := b[0], int(b[1])
		if 2+n > len(b) {
			return ""
		}
		if t == typ {
			return strings.TrimRight(string(b[2:2+n]), "\x00")
		}
		b = b[2+n:]
	}
	return ""
}

// nlConn is a blocking netlink socket for nf_tables GET requests: one
// send and one receive per reply message into a reused buffer (the
// kernel then fills dump messages of up to 32 KiB, so big dumps restart
// less often), no acks asked.
type nlConn struct {
	fd  int
	seq uint32
	buf []byte
}

func netlinkDial() (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nftables: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nftables: netlink bind: %w", err)
	}
	return &nlConn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (c *nlConn) Close() error { return unix.Close(c.fd) }

// get sends one request and collects the payloads of its replies, until
// NLMSG_DONE for a dump; an NLMSG_ERROR returns its errno.
func (c *nlConn) get(typ uint16, dump bool, family byte, as []attr) ([][]byte, error) {
	c.seq++
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	req := make([]byte, unix.NLMSG_HDRLEN+4, 256)
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], flags)
	binary.NativeEndian.PutUint32(req[8:], c.seq)
	req[16], req[17] = family, unix.NFNETLINK_V0
	for _, a := range as {
		n := 4 + len(a.val)
		req = binary.NativeEndian.AppendUint16(req, uint16(n))
		req = binary.NativeEndian.AppendUint16(req, a.typ)
		req = append(req, a.val...)
		req = append(req, make([]byte, (4-n%4)%4)...)
	}
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	var out [][]byte
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		if n > len(c.buf) {
			return nil, fmt.Errorf("netlink receive: message of %d bytes truncated", n)
		}
		b := c.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b))
			mt := binary.NativeEndian.Uint16(b[4:])
			mf := binary.NativeEndian.Uint16(b[6:])
			seq := binary.NativeEndian.Uint32(b[8:])
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return nil, errors.New("netlink receive: bad message")
			}
			data := b[unix.NLMSG_HDRLEN:l]
			b = b[min((l+3)&^3, len(b)):]
			if seq != c.seq {
				continue // an answer to an earlier request
			}
			switch {
			case mt == unix.NLMSG_ERROR:
				if len(data) < 4 {
					return nil, errors.New("netlink receive: short error")
				}
				if code := int32(binary.NativeEndian.Uint32(data)); code != 0 {
					return nil, syscall.Errno(-code)
				}
				return out, nil
			case mt == unix.NLMSG_DONE:
				return out, nil
			case len(data) >= 4:
				out = append(out, slices.Clone(data[4:]))
			}
			if mf&unix.NLM_F_MULTI == 0 {
				return out, nil
			}
		}
	}
}

// verdictChain is the chain a "jump X" or "goto X" names ("" for others).
func verdictChain(v string) string {
	if c, ok := strings.CutPrefix(v, "goto "); ok {
		return c
	}
	if c, ok := strings.CutPrefix(v, "jump "); ok {
		return c
	}
	return ""
}

// elemAttrs reads a set element's attributes in place.
type elemAttrs []byte

func (b elemAttrs) get(t uint16) []byte { return attrGet(b, t) }
