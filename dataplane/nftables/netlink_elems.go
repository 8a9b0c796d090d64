package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	gnft "github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// The element dumps. Explain reads every weight map, one GETSETELEM dump
// each (the kernel has no dump of a whole table's elements). Most of each
// dump's cost is in the kernel, which finds the set by walking the
// table's list of sets, by name in the request and by address again in
// each dump call, so the total grows with the square of the Services:
// 100,000 elements in 10,000 per-port maps cost 5.0 CPU-s with nothing
// else in the table (docs/data/nftables-weight-layouts-2026-12-07.txt).
// Here the userspace share is kept small: the replies are decoded in
// place on a blocking socket (google/nftables' generic decoder allocated
// an attribute decoder per element and field, and asked for an ack per
// dump; explain at 10,000 Services went from 7.2-8.6 to 5.7-6.1 CPU-s,
// docs/data/nftables-explain-fast-2026-12-07.txt).

// elemReaders is how many sockets read the weight maps at once, so that
// on an idle node both cores can do the kernel's part. Measured only on
// a loaded machine (load 15-18), where 1, 2 or 4 made no difference.
var elemReaders = 2

// rawElem is one element of a GETSETELEM reply as the kernel sent it:
// key, key end and value (a verdict value is the NFTA_DATA_VERDICT
// attributes) and the comment's user data, all slices of the receive
// buffer, valid only during the callback that gets them.
type rawElem struct {
	key, keyEnd, val, udata []byte
	intervalEnd             bool
}

// comment is the element's comment ("" without one).
func (e *rawElem) comment() string { return udataComment(e.udata) }

// setElement copies e into google/nftables' type.
func (e *rawElem) setElement() gnft.SetElement {
	return gnft.SetElement{Key: slices.Clone(e.key), KeyEnd: slices.Clone(e.keyEnd), Val: slices.Clone(e.val),
		IntervalEnd: e.intervalEnd, Comment: e.comment()}
}

// eachElem reads set's elements over c and calls fn with each, decoded in
// place in the receive buffer (an error is the kernel's, the decoder's or
// fn's, not wrapped): nothing is allocated per element but what fn
// keeps. Explain at 10,000 Services x 10 endpoints had decoded every
// element into a google/nftables SetElement (three byte slices each),
// 100,000 of them for the hairpin set alone; growing their slices took
// 0.08 s of its 1.4 CPU-s (a profile of five explains).
func eachElem(c *nlConn, family byte, set string, fn func(*rawElem) error) error {
	return c.each(uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM), true, family, []nlAttr{
		{unix.NFTA_SET_ELEM_LIST_TABLE, append([]byte(TableName), 0)},
		{unix.NFTA_SET_ELEM_LIST_SET, append([]byte(set), 0)},
	}, func(b []byte) error { return eachElemIn(b, fn) })
}

// dumpElems reads set's elements over c, as google/nftables' SetElement
// (key, key end, value, interval end and comment only).
func dumpElems(c *nlConn, family byte, set string) ([]gnft.SetElement, error) {
	var out []gnft.SetElement
	err := eachElem(c, family, set, func(e *rawElem) error {
		out = append(out, e.setElement())
		return nil
	})
	return out, err
}

// decodeElemList appends the elements of one GETSETELEM reply (its
// attributes, after the nfgenmsg header) to out.
func decodeElemList(out []gnft.SetElement, b []byte) ([]gnft.SetElement, error) {
	err := eachElemIn(b, func(e *rawElem) error {
		out = append(out, e.setElement())
		return nil
	})
	return out, err
}

// eachElemIn calls fn with each element of one GETSETELEM reply.
func eachElemIn(b []byte, fn func(*rawElem) error) error {
	var x rawElem
	return eachAttr(b, func(typ uint16, list []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return eachAttr(list, func(typ uint16, e []byte) error {
			if typ != unix.NFTA_LIST_ELEM {
				return nil
			}
			x = rawElem{}
			if err := decodeElem(e, &x); err != nil {
				return err
			}
			return fn(&x)
		})
	})
}

// decodeElem decodes one NFTA_LIST_ELEM's attributes into x.
func decodeElem(b []byte, x *rawElem) error {
	return eachAttr(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			x.key = attrGet(v, unix.NFTA_DATA_VALUE)
		case gnft.NFTA_SET_ELEM_KEY_END:
			x.keyEnd = attrGet(v, unix.NFTA_DATA_VALUE)
		case unix.NFTA_SET_ELEM_DATA:
			if x.val = attrGet(v, unix.NFTA_DATA_VALUE); x.val == nil {
				x.val = attrGet(v, unix.NFTA_DATA_VERDICT)
			}
		case unix.NFTA_SET_ELEM_FLAGS:
			if len(v) != 4 {
				return fmt.Errorf("element flags of %d bytes", len(v))
			}
			x.intervalEnd = binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_USERDATA:
			x.udata = v
		}
		return nil
	})
}

// udataComment is the comment in an element's user data: a list of
// type (one byte), length (one byte), value; the comment is type 0
// (NFTNL_UDATA_SET_ELEM_COMMENT), NUL-terminated.
func udataComment(b []byte) string {
	for len(b) >= 2 {
		t, n := b[0], int(b[1])
		if 2+n > len(b) {
			return ""
		}
		if t == 0 {
			return strings.TrimRight(string(b[2:2+n]), "\x00")
		}
		b = b[2+n:]
	}
	return ""
}

// dumpElemsOf reads the elements of each named set over up to readers
// sockets at once; a set that is gone reads as none.
func dumpElemsOf(family byte, names []string, readers int) ([][]gnft.SetElement, error) {
	out := make([][]gnft.SetElement, len(names))
	err := eachSetOf(family, names, readers, func(i int, e *rawElem) error {
		out[i] = append(out[i], e.setElement())
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachSetOf reads the elements of each named set over up to readers
// sockets at once and calls fn with each and its set's index in names
// (calls for one set come from one goroutine, in the kernel's order; the
// sets' calls run concurrently); a set that is gone reads as none.
func eachSetOf(family byte, names []string, readers int, fn func(int, *rawElem) error) error {
	readers = max(1, min(readers, len(names)))
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for w := 0; w < readers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := netlinkDial()
			if err != nil {
				errs[w] = err
				return
			}
			defer c.Close()
			// Interleaved, so each socket gets as many big maps as small.
			for i := w; i < len(names); i += readers {
				err := eachElem(c, family, names[i], func(e *rawElem) error { return fn(i, e) })
				if err != nil && !isNotFound(err) {
					errs[w] = fmt.Errorf("nftables: elements of %s: %w", names[i], err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
