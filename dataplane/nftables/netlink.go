package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
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
// every operation has a netlink encoding (the operations of an endpoint
// or weight change: chains, flushes, the typed rules and elements of the
// model, model.go, whose statements encode themselves) goes to the kernel
// as one netlink batch, which the kernel applies atomically like nft -f;
// anything else (new maps and sets, base chains, the table, statements
// only nft writes) goes through nft. Both writers work from the same typed
// objects: nothing here reads rule text. The encodings are byte for byte
// what nft 1.0.6 writes for the model's text (checked by
// TestNetlinkMatchesNft against the kernel's bytecode, "nft
// --debug=netlink list table"), so the packet path, "nft list" and explain
// are the same whichever path wrote it.

// op is one operation of a sync, kept so the transaction can be sent either
// as nft text or over netlink: a knftables object (the table, chains,
// sets and maps, the elements of the node's sets), or a typed rule or
// element of the model (model.go), which each writer spells itself.
type op struct {
	verb byte // 'a'dd, 'f'lush, 'd'elete
	// obj is a knftables.Object, a *ruleOp or a setElem: one field, since
	// a first sync of 10,000 Services queues 200,000 operations.
	obj any
}

// ruleOp is a rule added to a chain.
type ruleOp struct {
	chain   string
	r       rule
	comment *string
}

// ops is a transaction being built.
type ops struct{ list []op }

// txn is what the sync writes into.
type txn interface {
	Add(knftables.Object)
	Flush(knftables.Object)
	Delete(knftables.Object)
	// AddRule appends a rule to chain.
	AddRule(chain string, comment *string, r rule)
	// AddElem and DeleteElem add and delete a typed element.
	AddElem(setElem)
	DeleteElem(setElem)
	NumOperations() int
}

var _ txn = (*ops)(nil)

func (t *ops) Add(o knftables.Object)    { t.list = append(t.list, op{'a', o}) }
func (t *ops) Flush(o knftables.Object)  { t.list = append(t.list, op{'f', o}) }
func (t *ops) Delete(o knftables.Object) { t.list = append(t.list, op{'d', o}) }
func (t *ops) AddRule(chain string, comment *string, r rule) {
	t.list = append(t.list, op{'a', &ruleOp{chain, r, comment}})
}
func (t *ops) AddElem(e setElem)    { t.list = append(t.list, op{'a', e}) }
func (t *ops) DeleteElem(e setElem) { t.list = append(t.list, op{'d', e}) }
func (t *ops) NumOperations() int   { return len(t.list) }

// object is the knftables object of o, rules and elements spelled for
// family f.
func (o op) object(f fam) knftables.Object {
	switch x := o.obj.(type) {
	case *ruleOp:
		return &knftables.Rule{Chain: x.chain, Rule: x.r.text(f), Comment: x.comment}
	case setElem:
		return x.knft(f, o.verb == 'a')
	}
	return o.obj.(knftables.Object)
}

// into replays the operations into a knftables transaction.
func (t *ops) into(tx *knftables.Transaction, f fam) {
	for _, o := range t.list {
		o.replay(tx, o.object(f))
	}
}

// replay adds obj to tx with the operation's verb.
func (o op) replay(tx *knftables.Transaction, obj knftables.Object) {
	switch o.verb {
	case 'a':
		tx.Add(obj)
	case 'f':
		tx.Flush(obj)
	default:
		tx.Delete(obj)
	}
}

// maxNetlinkOps bounds a transaction sent over netlink. The batch goes in
// one sendmsg, which the kernel refuses beyond the socket's send buffer,
// and every message is acked into the receive buffer: both are raised to
// netlinkBuffer for the writer's sockets (as nft sizes its own to the
// batch). At up to about 1 KiB an operation sent (a rule with a 128-byte
// comment; an element is far less) and an ack's skb under 1 KiB, 20,000
// stay well inside. One endpoint change is about 20 operations. The bound
// was 500 with the default buffers (208 KiB), and a change of more than
// about 25 Services went through nft, which with single-field weight maps
// reads every one of them first: a sync of 40 changed Services at 10,000
// cost 0.68 CPU-s that way (0.35 with the concatenated key).
const maxNetlinkOps = 20000

// netlinkBuffer is the send and receive buffer of the writer's sockets.
// A limit, not an allocation: a small batch uses what it needs.
const netlinkBuffer = 32 << 20

// bigBuffers raises a socket's buffers to netlinkBuffer, past the
// sysctl limits (SO_SNDBUFFORCE and SO_RCVBUFFORCE need CAP_NET_ADMIN,
// which writing nftables needs anyway).
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, netlinkBuffer); e != nil && serr == nil {
				serr = fmt.Errorf("nftables: netlink socket buffer: %w", e)
			}
		}
	})
	return errors.Join(err, serr)
}

// netlinkWriter sends transactions of the supported shapes over netlink.
type netlinkWriter struct {
	family int
	f      fam
	table  *gnft.Table
	// opts open each batch's connection: big buffers (tests: a fake
	// socket).
	opts []gnft.ConnOption
}

func newNetlinkWriter(family int) *netlinkWriter {
	fam := gnft.TableFamilyIPv4
	if family == 6 {
		fam = gnft.TableFamilyIPv6
	}
	return &netlinkWriter{family: family, f: famOf(family), table: &gnft.Table{Name: TableName, Family: fam},
		opts: []gnft.ConnOption{gnft.WithSockOptions(bigBuffers)}}
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
	c, err := gnft.New(w.opts...)
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
	case *ruleOp:
		if o.verb != 'a' {
			return errUnsupported{"rule operation"}
		}
		exprs, err := x.r.encode(w.f)
		if err != nil {
			return err
		}
		r := &gnft.Rule{Table: w.table, Chain: &gnft.Chain{Name: x.chain, Table: w.table}, Exprs: exprs}
		if x.comment != nil {
			if err := commentFits(*x.comment); err != nil {
				return err
			}
			r.UserData = userdata.AppendString(nil, userdata.TypeComment, *x.comment)
		}
		c.AddRule(r)
		return nil
	case setElem:
		return w.element(c, o.verb, x)
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

// element queues one typed element.
func (w *netlinkWriter) element(c *gnft.Conn, verb byte, e setElem) error {
	name, isMap := e.set()
	els, err := e.netlink(w.f, verb == 'a')
	if err != nil {
		return err
	}
	s := &gnft.Set{Table: w.table, Name: name, IsMap: isMap}
	switch verb {
	case 'a':
		return c.SetAddElements(s, els)
	case 'd':
		return c.SetDeleteElements(s, els)
	}
	return errUnsupported{"element flush"}
}

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

// elements reads a shared map's elements over netlink. "nft -j list map"
// of service-ips cost minutes at 30,000 Services (nft fills its whole
// cache first); this is one dump of the map.
func (w *netlinkWriter) elements(name string) ([]elem, error) {
	es, alen, err := w.dump(name)
	if err != nil || es == nil {
		return nil, err
	}
	out := make([]elem, 0, len(es))
	for _, e := range es {
		key, err := decodeSvcKey(name, e.Key, alen)
		if err != nil {
			return nil, err
		}
		to, err := decodeVerdict(e.Val)
		if err != nil {
			return nil, fmt.Errorf("map %s: %w", name, err)
		}
		out = append(out, elem{m: name, key: key, to: to})
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

// commentFits refuses what nft would refuse: the kernel takes comments up
// to 256 bytes, nft only 128, and a table both write must list the same.
func commentFits(c string) error {
	if len(c) > dataplane.NftCommentMax {
		return fmt.Errorf("nftables: comment of %d bytes, nft allows %d: %q", len(c), dataplane.NftCommentMax, c)
	}
	return nil
}
