package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Why a second writer. nft 1.0.6 fills its cache with every chain and set
// name of the table before any command, even a single "add element": at
// 10,000 Services (110,000 chains) that is 2.7 CPU-s of kernel time per
// nft run, because the kernel restarts its chain dump from the first
// chain for every netlink message it fills (perf: nf_tables_dump_chains,
// __nf_tables_dump_rules). A transaction sent over netlink needs no cache:
// the kernel resolves chain and set names itself. So a transaction whose
// every operation is one of the few shapes below (the operations of an
// endpoint or weight change) goes to the kernel as one netlink batch,
// which the kernel applies atomically like nft -f; anything else (new
// maps and sets, base chains, the table) goes through nft. The encodings
// are byte for byte what nft 1.0.6 writes for the same text (checked by
// TestNetlinkMatchesNft against the kernel's bytecode, "nft
// --debug=netlink list table"), so the packet path, "nft list" and explain
// are the same whichever path wrote it.

// op is one operation of a sync, kept so the transaction can be sent either
// as nft text or over netlink.
type op struct {
	verb byte // 'a'dd, 'f'lush, 'd'elete
	obj  knftables.Object
}

// ops is a transaction being built; it satisfies txn.
type ops struct{ list []op }

// txn is what the sync writes into: a knftables.Transaction or ops.
type txn interface {
	Add(knftables.Object)
	Flush(knftables.Object)
	Delete(knftables.Object)
	NumOperations() int
}

var (
	_ txn = (*ops)(nil)
	_ txn = (*knftables.Transaction)(nil)
)

func (t *ops) Add(o knftables.Object)    { t.list = append(t.list, op{'a', o}) }
func (t *ops) Flush(o knftables.Object)  { t.list = append(t.list, op{'f', o}) }
func (t *ops) Delete(o knftables.Object) { t.list = append(t.list, op{'d', o}) }
func (t *ops) NumOperations() int        { return len(t.list) }

// into replays the operations into a knftables transaction.
func (t *ops) into(tx *knftables.Transaction) {
	for _, o := range t.list {
		switch o.verb {
		case 'a':
			tx.Add(o.obj)
		case 'f':
			tx.Flush(o.obj)
		default:
			tx.Delete(o.obj)
		}
	}
}

// maxNetlinkOps bounds a transaction sent over netlink. The batch goes in
// one sendmsg, which the kernel refuses beyond the socket's send buffer
// (wmem_default, 208 KiB here), and every message is acked into the
// receive buffer; at a few hundred bytes an operation, 500 stay well
// inside. One endpoint change is about 20 operations; a change large
// enough to pass the bound goes through nft, whose cache fill it then
// amortizes.
const maxNetlinkOps = 500

// netlinkWriter sends transactions of the supported shapes over netlink.
type netlinkWriter struct {
	family int
	table  *gnft.Table
}

func newNetlinkWriter(family int) *netlinkWriter {
	fam := gnft.TableFamilyIPv4
	if family == 6 {
		fam = gnft.TableFamilyIPv6
	}
	return &netlinkWriter{family: family, table: &gnft.Table{Name: TableName, Family: fam}}
}

// errUnsupported: the transaction has an operation this writer does not
// encode; it goes through nft instead.
type errUnsupported struct{ what string }

func (e errUnsupported) Error() string { return "not encoded over netlink: " + e.what }

// build queues t on a new connection without sending anything; an
// errUnsupported means nothing was sent and nft must run t.
func (w *netlinkWriter) build(t *ops) (*gnft.Conn, error) {
	if len(t.list) > maxNetlinkOps {
		return nil, errUnsupported{fmt.Sprintf("%d operations", len(t.list))}
	}
	c, err := gnft.New()
	if err != nil {
		return nil, err
	}
	for _, o := range t.list {
		if err := w.queue(c, o); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (w *netlinkWriter) queue(c *gnft.Conn, o op) error {
	switch x := o.obj.(type) {
	case *knftables.Chain:
		if x.Type != nil || x.Hook != nil || x.Priority != nil || x.Comment != nil || x.Handle != nil {
			return errUnsupported{"base chain " + x.Name}
		}
		ch := &gnft.Chain{Name: x.Name, Table: w.table}
		switch o.verb {
		case 'a':
			c.AddChain(ch)
		case 'f':
			c.FlushChain(ch)
		default:
			c.DelChain(ch)
		}
		return nil
	case *knftables.Map:
		return w.set(c, o.verb, x.Name)
	case *knftables.Set:
		return w.set(c, o.verb, x.Name)
	case *knftables.Rule:
		if o.verb != 'a' || x.Handle != nil || x.Index != nil {
			return errUnsupported{"rule operation"}
		}
		exprs, err := w.rule(x.Rule)
		if err != nil {
			return err
		}
		r := &gnft.Rule{Table: w.table, Chain: &gnft.Chain{Name: x.Chain, Table: w.table}, Exprs: exprs}
		if x.Comment != nil {
			if err := commentFits(*x.Comment); err != nil {
				return err
			}
			r.UserData = userdata.AppendString(nil, userdata.TypeComment, *x.Comment)
		}
		c.AddRule(r)
		return nil
	case *knftables.Element:
		return w.element(c, o.verb, x)
	}
	return errUnsupported{fmt.Sprintf("%T", o.obj)}
}

func (w *netlinkWriter) set(c *gnft.Conn, verb byte, name string) error {
	s := &gnft.Set{Table: w.table, Name: name}
	switch verb {
	case 'f':
		c.FlushSet(s)
	case 'd':
		c.DelSet(s)
	default:
		return errUnsupported{"new set " + name} // needs nft's typeof user data
	}
	return nil
}

// The rule shapes written over netlink (everything else goes through nft).
var (
	reSaddrJump  = regexp.MustCompile(`^(ip6?) saddr (\S+) (jump|goto) (\S+)$`)
	reNLDNAT     = regexp.MustCompile(`^meta l4proto (tcp|udp|sctp) dnat to (\S+)$`)
	reVIPMasq    = regexp.MustCompile(`^(ip6?) daddr (\S+) (tcp|udp|sctp) dport (\d+)( (ip6?) saddr != @(\S+))? jump (\S+)$`)
	reNumgenVmap = regexp.MustCompile(`^numgen random mod (\d+) \. meta l4proto vmap @(\S+)$`)
	reNumgenDNAT = regexp.MustCompile(`^meta l4proto (tcp|udp|sctp) dnat (ip6?) to numgen random mod (\d+) \. meta l4proto map @(\S+)$`)
	reVerdict    = regexp.MustCompile(`^(jump|goto) (\S+)$`)
)

var protoNumbers = map[string]byte{"tcp": unix.IPPROTO_TCP, "udp": unix.IPPROTO_UDP, "sctp": unix.IPPROTO_SCTP}

func verdict(kind, chain string) *expr.Verdict {
	k := expr.VerdictJump
	if kind == "goto" {
		k = expr.VerdictGoto
	}
	return &expr.Verdict{Kind: k, Chain: chain}
}

// addrOffset is where the source or destination address sits in the IP
// header of w's family, and its length.
func (w *netlinkWriter) addrOffset(dst bool) (uint32, uint32) {
	if w.family == 6 {
		if dst {
			return 24, 16
		}
		return 8, 16
	}
	if dst {
		return 16, 4
	}
	return 12, 4
}

func (w *netlinkWriter) addr(s string) ([]byte, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Is4() != (w.family == 4) {
		return nil, errUnsupported{"address " + s}
	}
	return a.AsSlice(), nil
}

func (w *netlinkWriter) loadAddr(dst bool) *expr.Payload {
	off, n := w.addrOffset(dst)
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
}

func l4proto(reg uint32) *expr.Meta { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }

// rule encodes one rule of the supported shapes as nft 1.0.6 does.
func (w *netlinkWriter) rule(text string) ([]expr.Any, error) {
	ip := famOf(w.family).ip
	if m := reSaddrJump.FindStringSubmatch(text); m != nil && m[1] == ip {
		a, err := w.addr(m[2])
		if err != nil {
			return nil, err
		}
		return []expr.Any{w.loadAddr(false), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a}, verdict(m[3], m[4])}, nil
	}
	if m := reNLDNAT.FindStringSubmatch(text); m != nil {
		ap, err := netip.ParseAddrPort(m[2])
		if err != nil || ap.Addr().Is4() != (w.family == 4) {
			return nil, errUnsupported{"dnat target " + m[2]}
		}
		nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(unix.NFPROTO_IPV4), RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 2, RegProtoMax: 2, Specified: true}
		if w.family == 6 {
			nat.Family = unix.NFPROTO_IPV6
		}
		return []expr.Any{
			l4proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumbers[m[1]]}},
			&expr.Immediate{Register: 1, Data: ap.Addr().AsSlice()},
			&expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, ap.Port())},
			nat,
		}, nil
	}
	if m := reVIPMasq.FindStringSubmatch(text); m != nil && m[1] == ip && (m[6] == "" || m[6] == ip) {
		a, err := w.addr(m[2])
		if err != nil {
			return nil, err
		}
		port, err := strconv.ParseUint(m[4], 10, 16)
		if err != nil {
			return nil, errUnsupported{"port " + m[4]}
		}
		out := []expr.Any{
			w.loadAddr(true), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a},
			l4proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumbers[m[3]]}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))},
		}
		if m[7] != "" {
			out = append(out, w.loadAddr(false), &expr.Lookup{SourceRegister: 1, SetName: m[7], Invert: true})
		}
		return append(out, verdict("jump", m[8])), nil
	}
	if m := reNumgenVmap.FindStringSubmatch(text); m != nil {
		mod, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			return nil, errUnsupported{"modulus " + m[1]}
		}
		// nft turns both fields to network order for the interval map
		// (its keys are stored big endian), the second in the next 32-bit
		// register (NFT_REG32_01 = 9); without the byteorder steps the
		// lookup misses (listings do not show them: "nft --debug=netlink"
		// does, and TestNetlinkMatchesNft compares that).
		return []expr.Any{
			&expr.Numgen{Register: 1, Modulus: uint32(mod), Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
			l4proto(9),
			&expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Size: 2, Len: 1},
			&expr.Lookup{SourceRegister: 1, SetName: m[2], IsDestRegSet: true, DestRegister: 0},
		}, nil
	}
	if m := reNumgenDNAT.FindStringSubmatch(text); m != nil && m[2] == ip {
		mod, err := strconv.ParseUint(m[3], 10, 32)
		if err != nil {
			return nil, errUnsupported{"modulus " + m[3]}
		}
		// The key as for the verdict map; the map's value (address .
		// port) lands in register 1 and after it: the port in
		// NFT_REG32_01 (9) after an IPv4 address, in the second 128-bit
		// register (2) after an IPv6 one, as nft --debug=netlink shows.
		nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: 1, RegProtoMin: 9, RegProtoMax: 9, Specified: true}
		if w.family == 6 {
			nat.Family, nat.RegProtoMin, nat.RegProtoMax = unix.NFPROTO_IPV6, 2, 2
		}
		return []expr.Any{
			l4proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{protoNumbers[m[1]]}},
			&expr.Numgen{Register: 1, Modulus: uint32(mod), Type: unix.NFT_NG_RANDOM},
			&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
			l4proto(9),
			&expr.Byteorder{SourceRegister: 9, DestRegister: 9, Op: expr.ByteorderHton, Size: 2, Len: 1},
			&expr.Lookup{SourceRegister: 1, SetName: m[4], IsDestRegSet: true, DestRegister: 1},
			nat,
		}, nil
	}
	if m := reVerdict.FindStringSubmatch(text); m != nil {
		return []expr.Any{verdict(m[1], m[2])}, nil
	}
	return nil, errUnsupported{"rule " + text}
}

// pad4 pads a concatenation field to its 32-bit register.
func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// element encodes an element of the weight maps and the shared maps.
func (w *netlinkWriter) element(c *gnft.Conn, verb byte, e *knftables.Element) error {
	name := e.Map
	if name == "" {
		name = e.Set
	}
	var el gnft.SetElement
	dnat := strings.HasPrefix(name, dnatPrefix+"c-") || strings.HasPrefix(name, dnatPrefix+"l-") || countedMap(name)
	switch {
	case dnat || strings.HasPrefix(name, wPrefix+"c-") || strings.HasPrefix(name, wPrefix+"l-"):
		// "lo-hi . proto": numgen's value big endian, as nft stores it.
		if len(e.Key) != 2 {
			return errUnsupported{"weight map key"}
		}
		lo, hi, ok := strings.Cut(e.Key[0], "-")
		if !ok {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 32)
		h, err2 := strconv.ParseUint(hi, 10, 32)
		p, ok := protoNumbers[e.Key[1]]
		if err1 != nil || err2 != nil || !ok {
			return errUnsupported{"weight map key " + strings.Join(e.Key, " . ")}
		}
		el.Key = pad4(append(binary.BigEndian.AppendUint32(nil, uint32(l)), p))
		el.KeyEnd = pad4(append(binary.BigEndian.AppendUint32(nil, uint32(h)), p))
	case name == mapServiceIPs || name == mapNoEndpointServices:
		if len(e.Key) != 3 {
			return errUnsupported{"service map key"}
		}
		a, err := w.addr(e.Key[0])
		p, ok := protoNumbers[e.Key[1]]
		port, err2 := strconv.ParseUint(e.Key[2], 10, 16)
		if err != nil || !ok || err2 != nil {
			return errUnsupported{"service map key " + strings.Join(e.Key, " . ")}
		}
		el.Key = append(append(a, pad4([]byte{p})...), pad4(binary.BigEndian.AppendUint16(nil, uint16(port)))...)
	case name == mapServiceNodePorts || name == mapNoEndpointNodePorts:
		if len(e.Key) != 2 {
			return errUnsupported{"node port map key"}
		}
		p, ok := protoNumbers[e.Key[0]]
		port, err := strconv.ParseUint(e.Key[1], 10, 16)
		if !ok || err != nil {
			return errUnsupported{"node port map key " + strings.Join(e.Key, " . ")}
		}
		el.Key = append(pad4([]byte{p}), pad4(binary.BigEndian.AppendUint16(nil, uint16(port)))...)
	case name == setHairpin:
		// "address . proto . port . address", each field in its register.
		if len(e.Key) != 4 || e.Key[0] != e.Key[3] {
			return errUnsupported{"hairpin key"}
		}
		a, err := w.addr(e.Key[0])
		p, ok := protoNumbers[e.Key[1]]
		port, err2 := strconv.ParseUint(e.Key[2], 10, 16)
		if err != nil || !ok || err2 != nil {
			return errUnsupported{"hairpin key " + strings.Join(e.Key, " . ")}
		}
		el.Key = append(append(append(slices.Clone(a), pad4([]byte{p})...), pad4(binary.BigEndian.AppendUint16(nil, uint16(port)))...), a...)
	default:
		return errUnsupported{"elements of " + name}
	}
	isMap := e.Map != ""
	if isMap && dnat {
		// "address . port": the address, then the port in its register.
		if verb == 'a' {
			f := strings.Split(strings.Join(e.Value, " . "), " . ")
			if len(f) != 2 {
				return errUnsupported{"DNAT map value " + strings.Join(e.Value, " . ")}
			}
			a, err := w.addr(strings.TrimSpace(f[0]))
			port, err2 := strconv.ParseUint(strings.TrimSpace(f[1]), 10, 16)
			if err != nil || err2 != nil {
				return errUnsupported{"DNAT map value " + strings.Join(e.Value, " . ")}
			}
			el.Val = append(a, pad4(binary.BigEndian.AppendUint16(nil, uint16(port)))...)
		}
	} else if isMap {
		v := strings.Join(e.Value, " ")
		switch {
		case v == "drop":
			el.VerdictData = &expr.Verdict{Kind: expr.VerdictDrop}
		case reVerdict.MatchString(v):
			m := reVerdict.FindStringSubmatch(v)
			el.VerdictData = verdict(m[1], m[2])
		case verb == 'd' && v == "":
			// a delete names the key only
		default:
			return errUnsupported{"map value " + v}
		}
	}
	if e.Comment != nil {
		if err := commentFits(*e.Comment); err != nil {
			return err
		}
		el.Comment = *e.Comment
	}
	s := &gnft.Set{Table: w.table, Name: name, IsMap: isMap}
	if verb == 'a' {
		return c.SetAddElements(s, []gnft.SetElement{el})
	}
	if verb == 'd' {
		el.VerdictData, el.Val, el.Comment = nil, nil, ""
		return c.SetDeleteElements(s, []gnft.SetElement{el})
	}
	return errUnsupported{"element flush"}
}

// protoNames are the names nft prints for protoNumbers.
var protoNames = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}

// dump reads one set's elements over netlink (nil when the set is not
// there) and gives the family's address length.
func (w *netlinkWriter) dump(name string) ([]gnft.SetElement, int, error) {
	c, err := gnft.New()
	if err != nil {
		return nil, 0, err
	}
	es, err := c.GetSetElements(&gnft.Set{Table: w.table, Name: name})
	if err != nil {
		if isNotFound(err) {
			return nil, 0, nil
		}
		return nil, 0, err
	}
	alen := 4
	if w.family == 6 {
		alen = 16
	}
	return es, alen, nil
}

// elements reads a shared map's elements over netlink, spelled as nft
// lists them. "nft -j list map" of service-ips cost minutes at 30,000
// Services (nft fills its whole cache first); this is one dump of the map.
func (w *netlinkWriter) elements(name string) ([]elem, error) {
	es, alen, err := w.dump(name)
	if err != nil || es == nil {
		return nil, err
	}
	out := make([]elem, 0, len(es))
	for _, e := range es {
		k := e.Key
		x := elem{m: name}
		if name == mapServiceIPs || name == mapNoEndpointServices {
			if len(k) != alen+8 {
				return nil, fmt.Errorf("map %s: key of %d bytes", name, len(k))
			}
			a, _ := netip.AddrFromSlice(k[:alen])
			x.key = append(x.key, a.String())
			k = k[alen:]
		}
		if len(k) != 8 {
			return nil, fmt.Errorf("map %s: key of %d bytes", name, len(e.Key))
		}
		proto, ok := protoNames[k[0]]
		if !ok {
			proto = strconv.Itoa(int(k[0]))
		}
		x.key = append(x.key, proto, strconv.Itoa(int(binary.BigEndian.Uint16(k[4:6]))))
		x.value, err = verdictText(e.Val)
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
		out = append(out, x)
	}
	return out, nil
}

// hairpinElements reads the hairpin set's elements over netlink.
func (w *netlinkWriter) hairpinElements() ([]hairpinKey, error) {
	es, alen, err := w.dump(setHairpin)
	if err != nil || es == nil {
		return nil, err
	}
	out := make([]hairpinKey, 0, len(es))
	for _, e := range es {
		k := e.Key
		if len(k) != 2*alen+8 {
			return nil, fmt.Errorf("set %s: key of %d bytes", setHairpin, len(k))
		}
		a, _ := netip.AddrFromSlice(k[:alen])
		if _, ok := protoNames[k[alen]]; !ok {
			return nil, fmt.Errorf("set %s: protocol %d", setHairpin, k[alen])
		}
		out = append(out, newHairpinKey(a, k[alen], binary.BigEndian.Uint16(k[alen+4:])))
	}
	return out, nil
}

// verdictText spells the verdict data of a map element as nft does.
func verdictText(b []byte) (string, error) {
	// Netlink attributes: length and type (host order, 16 bits each),
	// then the data, padded to 4 bytes.
	var code int32
	var chain string
	for len(b) >= 4 {
		n := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if n < 4 || n > len(b) {
			return "", fmt.Errorf("bad verdict attribute")
		}
		data := b[4:n]
		switch typ {
		case unix.NFTA_VERDICT_CODE:
			if len(data) == 4 {
				code = int32(binary.BigEndian.Uint32(data))
			}
		case unix.NFTA_VERDICT_CHAIN:
			chain = strings.TrimRight(string(data), "\x00")
		}
		b = b[min((n+3)&^3, len(b)):]
	}
	switch code {
	case int32(expr.VerdictGoto):
		return "goto " + chain, nil
	case int32(expr.VerdictJump):
		return "jump " + chain, nil
	case int32(expr.VerdictDrop):
		return "drop", nil
	case int32(expr.VerdictAccept):
		return "accept", nil
	case int32(expr.VerdictReturn):
		return "return", nil
	}
	return fmt.Sprintf("verdict %d", code), nil
}

// commentFits refuses what nft would refuse: the kernel takes comments up
// to 256 bytes, nft only 128, and a table both write must list the same.
func commentFits(c string) error {
	if len(c) > dataplane.NftCommentMax {
		return fmt.Errorf("nftables: comment of %d bytes, nft allows %d: %q", len(c), dataplane.NftCommentMax, c)
	}
	return nil
}
