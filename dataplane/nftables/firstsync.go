package nftables

import (
	"context"
	"errors"

	gnft "github.com/google/nftables"
)

// The elements of a sync into an empty table go over netlink (issue 21).
// Such a sync runs in batches of BatchPorts ports anyway (not atomic: a
// kill between batches leaves ports missing), so each batch is split: its
// objects and rules commit first as one transaction (through nft when it
// holds what only nft writes: the table, base chains, new maps), then its
// elements in netlink commits of maxElemsPerCommit. Why: perf of the first
// sync of 1,000 Services x 100 endpoints through one nft -f (6.2 CPU-s at
// load 20) put a third of its samples in nft's userspace (parsing and
// checking 200,000 elements of text: libnftables, libc, gmp); over netlink
// the kernel gets the same elements without that text. Order: the weight
// maps' and hairpin set's elements before the shared maps' (the entry
// points: service-ips and the others), so a kill mid-way leaves a port
// unreachable, never reachable with part of its endpoints.

// maxElemsPerCommit bounds the elements of one netlink commit. The batch
// goes in one sendmsg, refused beyond the socket's send buffer
// (wmem_default, 208 KiB here); a weight-map element with its interval
// end and value is about 70 bytes in a message that carries the set's
// other elements, so 1,000 stay near 70 KiB.
const maxElemsPerCommit = 1000

// maxElemsPerMessage bounds the elements of one message: they go in one
// netlink attribute, whose length has 16 bits (1,000 service-ips elements
// with their comments overflowed it, and the kernel answered ENOENT). An
// element is at most about 220 bytes (a 128-byte comment, key, verdict).
const maxElemsPerMessage = 200

// commitBatch commits one batch of a sync into an empty table: split as
// above when the Proxier has a netlink writer, else as one transaction.
func (p *Proxier) commitBatch(ctx context.Context, t *ops) error {
	if p.netlink == nil {
		return p.commit(ctx, t)
	}
	rest, weights, entries := p.netlink.splitElems(t)
	if rest.NumOperations() > 0 {
		if err := p.commit(ctx, rest); err != nil {
			return err
		}
	}
	for _, es := range [][]elemOp{weights, entries} {
		for len(es) > 0 {
			n := min(len(es), maxElemsPerCommit)
			if err := p.commitElems(es[:n]); err != nil {
				return err
			}
			es = es[n:]
		}
	}
	return nil
}

// elemOp is an element added over netlink: its set and its encoding.
type elemOp struct {
	set   string
	isMap bool
	el    gnft.SetElement
}

// splitElems takes the element additions that netlink encodes out of t:
// the weight maps' and hairpin set's (weights), and the shared maps'
// (entries). rest keeps every other operation in its order.
func (w *netlinkWriter) splitElems(t *ops) (rest *ops, weights, entries []elemOp) {
	rest = &ops{list: make([]op, 0, len(t.list)/4)}
	for _, o := range t.list {
		e, ok := o.obj.(setElem)
		if !ok || o.verb != 'a' {
			rest.list = append(rest.list, o)
			continue
		}
		el, err := e.netlink(w.f, true)
		if err != nil {
			// "return" values and the like: nft writes them, as before.
			rest.list = append(rest.list, o)
			continue
		}
		name, isMap := e.set()
		x := elemOp{name, isMap, el}
		if _, entry := e.(sharedElem); entry {
			entries = append(entries, x)
		} else {
			weights = append(weights, x)
		}
	}
	return rest, weights, entries
}

// commitElems adds es in one netlink commit, one message per run of
// up to maxElemsPerMessage elements of the same set, with the generation's bookkeeping of commit.
func (p *Proxier) commitElems(es []elemOp) (err error) {
	p.lastOps = len(es)
	gen0, ok0 := p.gen.before()
	defer func() { p.gen.after(gen0, ok0, err == nil) }()
	c, err := gnft.New(p.netlink.opts...)
	if err != nil {
		return err
	}
	for i := 0; i < len(es); {
		j := i + 1
		for j < len(es) && j-i < maxElemsPerMessage && es[j].set == es[i].set {
			j++
		}
		s := &gnft.Set{Table: p.netlink.table, Name: es[i].set, IsMap: es[i].isMap}
		run := make([]gnft.SetElement, j-i)
		for k := range run {
			run[k] = es[i+k].el
		}
		if err := c.SetAddElements(s, run); err != nil {
			return err
		}
		i = j
	}
	p.lastNetlink = true
	if err := c.Flush(); err != nil {
		return errors.Join(errors.New("nftables: elements over netlink"), err)
	}
	return nil
}
