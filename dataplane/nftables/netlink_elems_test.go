package nftables

import (
	"encoding/binary"
	"reflect"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestDecodeElemList decodes a GETSETELEM reply encoded here with
// mdlayher/netlink's encoder, the shape the kernel sends
// (nf_tables_fill_setelem): a verdict element with a range key and a
// comment, a DNAT value, an interval end, and attributes the reader
// ignores (a timeout, an expiration).
func TestDecodeElemList(t *testing.T) {
	data := func(ae *netlink.AttributeEncoder, typ uint16, v []byte) {
		ae.Nested(typ, func(n *netlink.AttributeEncoder) error {
			n.Bytes(unix.NFTA_DATA_VALUE, v)
			return nil
		})
	}
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian // values as the kernel puts them (nla_put_be32)
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, TableName)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, "w-x")
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(l *netlink.AttributeEncoder) error {
		l.Nested(unix.NFTA_LIST_ELEM, func(e *netlink.AttributeEncoder) error {
			data(e, unix.NFTA_SET_ELEM_KEY, []byte{0, 0, 0, 3, 6, 0, 0, 0})
			data(e, gnft.NFTA_SET_ELEM_KEY_END, []byte{0, 0, 0, 9, 6, 0, 0, 0})
			e.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
				d.Nested(unix.NFTA_DATA_VERDICT, func(v *netlink.AttributeEncoder) error {
					v.Int32(unix.NFTA_VERDICT_CODE, int32(expr.VerdictGoto))
					v.String(unix.NFTA_VERDICT_CHAIN, "ep-abc")
					return nil
				})
				return nil
			})
			// NFTNL_UDATA_SET_ELEM_COMMENT (0), its length, the text.
			e.Bytes(unix.NFTA_SET_ELEM_USERDATA, append([]byte{0, 8}, "ns/svc:\x00"...))
			e.Uint64(unix.NFTA_SET_ELEM_TIMEOUT, 1000)
			return nil
		})
		l.Nested(unix.NFTA_LIST_ELEM, func(e *netlink.AttributeEncoder) error {
			data(e, unix.NFTA_SET_ELEM_KEY, []byte{0, 0, 0, 0, 17, 0, 0, 0})
			data(e, unix.NFTA_SET_ELEM_DATA, []byte{198, 19, 0, 7, 0x1f, 0x90, 0, 0})
			e.Uint64(unix.NFTA_SET_ELEM_EXPIRATION, 500)
			return nil
		})
		l.Nested(unix.NFTA_LIST_ELEM, func(e *netlink.AttributeEncoder) error {
			e.Uint32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
			data(e, unix.NFTA_SET_ELEM_KEY, []byte{198, 18, 0, 0})
			return nil
		})
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeElemList(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d elements, want 3", len(got))
	}
	v, err := decodeVerdict(got[0].Val)
	if err != nil || v != goTo("ep-abc") {
		t.Errorf("verdict %+v (%v), want goto ep-abc", v, err)
	}
	got[0].Val = nil
	want := []gnft.SetElement{
		{Key: []byte{0, 0, 0, 3, 6, 0, 0, 0}, KeyEnd: []byte{0, 0, 0, 9, 6, 0, 0, 0}, Comment: "ns/svc:"},
		{Key: []byte{0, 0, 0, 0, 17, 0, 0, 0}, Val: []byte{198, 19, 0, 7, 0x1f, 0x90, 0, 0}},
		{Key: []byte{198, 18, 0, 0}, IntervalEnd: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded\n%+v\nwant\n%+v", got, want)
	}
	// A truncated reply is an error, not a short list.
	if _, err := decodeElemList(nil, b[:len(b)-3]); err == nil {
		t.Error("a truncated reply decoded without error")
	}
}
