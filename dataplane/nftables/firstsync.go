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
// (wmem_default, 208 KiB here); a weight-map range (two kernel elements:
// its start with the value, its end) is about 70 bytes in a message that
// carries the set's other elements, so 1,000 stay near 70 KiB.
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
	rest, weights, entries := splitElems(t)
	if rest.NumOperations() > 0 {
		if err := p.commit(ctx, rest); err != nil {
			return err
		}
	}
	for _, es := range [][]setElem{weights, entries} {
		for len(es) > 0 {
			n := min(len(es), maxElemsPerCommit)
			if err := p.commitElems(ctx, es[:n]); err != nil {
				return err
			}
			es = es[n:]
		}
	}
	return nil
}

// splitElems takes the element additions out of t: the weight maps' and
// hairpin set's (weights), and the shared maps' (entries). rest keeps
// every other operation in its order. The elements stay typed until their
// commit encodes them: the last batch of 10,000 Services x 10 carries the
// hairpin set's 100,000 elements, whose encodings held at once raised
// BenchmarkPeakMemory10kx10's peak by 10-20 MiB.
func splitElems(t *ops) (rest *ops, weights, entries []setElem) {
	rest = &ops{list: make([]op, 0, len(t.list)/4)}
	for _, o := range t.list {
		e, ok := o.obj.(setElem)
		switch {
		case !ok || o.verb != 'a':
			rest.list = append(rest.list, o)
		case isEntry(e):
			entries = append(entries, e)
		default:
			weights = append(weights, e)
		}
	}
	return rest, weights, entries
}

func isEntry(e setElem) bool {
	_, ok := e.(sharedElem)
	return ok
}

// commitElems adds es in one netlink commit, one message per run of up to
// maxElemsPerMessage elements of the same set, with the generation's
// bookkeeping of commit. Elements netlink does not encode (none that
// steelyard writes today) follow through nft.
func (p *Proxier) commitElems(ctx context.Context, es []setElem) (err error) {
	var byNft ops
	c, err := gnft.New(p.netlink.opts...)
	if err != nil {
		return err
	}
	run := make([]gnft.SetElement, 0, maxElemsPerMessage)
	var s *gnft.Set
	send := func() error {
		if len(run) == 0 {
			return nil
		}
		err := c.SetAddElements(s, run)
		run = run[:0]
		return err
	}
	for _, e := range es {
		name, isMap := e.set()
		els, err := e.netlink(p.netlink.f, true)
		var unsupported errUnsupported
		switch {
		case errors.As(err, &unsupported):
			byNft.AddElem(e)
			continue
		case err != nil:
			return err
		}
		if s == nil || s.Name != name || len(run)+len(els) > maxElemsPerMessage {
			if err := send(); err != nil {
				return err
			}
			s = &gnft.Set{Table: p.netlink.table, Name: name, IsMap: isMap}
		}
		run = append(run, els...)
	}
	if err := send(); err != nil {
		return err
	}
	if err := p.flushElems(c, len(es)-byNft.NumOperations()); err != nil {
		return err
	}
	if byNft.NumOperations() > 0 {
		return p.commit(ctx, &byNft)
	}
	return nil
}

// flushElems sends the n elements queued on c as one commit.
func (p *Proxier) flushElems(c *gnft.Conn, n int) (err error) {
	if n == 0 {
		return nil
	}
	p.lastOps = n
	gen0, ok0 := p.gen.before()
	defer func() { p.gen.after(gen0, ok0, err == nil) }()
	p.lastNetlink = true
	if err := c.Flush(); err != nil {
		return errors.Join(errors.New("nftables: elements over netlink"), err)
	}
	return nil
}
