package nftables

import (
	"encoding/binary"
	"fmt"
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

// dumpElems reads set's elements over c, as google/nftables' SetElement
// (key, key end, value, interval end and comment only; a verdict value
// is the NFTA_DATA_VERDICT attributes, as google/nftables gives it).
func dumpElems(c *nlConn, family byte, set string) ([]gnft.SetElement, error) {
	replies, err := c.get(uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM), true, family, []nlAttr{
		{unix.NFTA_SET_ELEM_LIST_TABLE, append([]byte(TableName), 0)},
		{unix.NFTA_SET_ELEM_LIST_SET, append([]byte(set), 0)},
	})
	if err != nil {
		return nil, err
	}
	var out []gnft.SetElement
	for _, b := range replies {
		if out, err = decodeElemList(out, b); err != nil {
			return nil, fmt.Errorf("set %s: %w", set, err)
		}
	}
	return out, nil
}

// decodeElemList appends the elements of one GETSETELEM reply (its
// attributes, after the nfgenmsg header) to out.
func decodeElemList(out []gnft.SetElement, b []byte) ([]gnft.SetElement, error) {
	err := eachAttr(b, func(typ uint16, list []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return eachAttr(list, func(typ uint16, e []byte) error {
			if typ != unix.NFTA_LIST_ELEM {
				return nil
			}
			x, err := decodeElem(e)
			out = append(out, x)
			return err
		})
	})
	return out, err
}

// decodeElem decodes one NFTA_LIST_ELEM's attributes.
func decodeElem(b []byte) (gnft.SetElement, error) {
	var x gnft.SetElement
	err := eachAttr(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			x.Key = attrGet(v, unix.NFTA_DATA_VALUE)
		case gnft.NFTA_SET_ELEM_KEY_END:
			x.KeyEnd = attrGet(v, unix.NFTA_DATA_VALUE)
		case unix.NFTA_SET_ELEM_DATA:
			if x.Val = attrGet(v, unix.NFTA_DATA_VALUE); x.Val == nil {
				x.Val = attrGet(v, unix.NFTA_DATA_VERDICT)
			}
		case unix.NFTA_SET_ELEM_FLAGS:
			if len(v) != 4 {
				return fmt.Errorf("element flags of %d bytes", len(v))
			}
			x.IntervalEnd = binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
		case unix.NFTA_SET_ELEM_USERDATA:
			x.Comment = udataComment(v)
		}
		return nil
	})
	return x, err
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
				es, err := dumpElems(c, family, names[i])
				if err != nil && !isNotFound(err) {
					errs[w] = fmt.Errorf("nftables: elements of %s: %w", names[i], err)
					return
				}
				out[i] = es
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
