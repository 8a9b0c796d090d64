package nfacct

import (
	"encoding/binary"
	"testing"
)

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, v []byte) []byte {
	b := make([]byte, 4, 4+len(v)+3)
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func be64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// The kernel's answer to a get, as nfnl_acct_fill_info writes it: the
// nfgenmsg header, name, packets, bytes, use count.
func TestDecode(t *testing.T) {
	msg := []byte{0, 0, 0, 0}
	msg = append(msg, attr(attrName, []byte("steelyard_localhost_nps\x00"))...)
	msg = append(msg, attr(attrPkts, be64(1100))...)
	msg = append(msg, attr(attrBytes, be64(66000))...)
	msg = append(msg, attr(4, []byte{0, 0, 0, 1})...) // NFACCT_USE
	c, err := Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	if c != (Counter{Name: "steelyard_localhost_nps", Packets: 1100, Bytes: 66000}) {
		t.Errorf("decoded %+v", c)
	}
	if _, err := Decode(msg[:4+28]); err == nil {
		t.Error("a message without counts decoded")
	}
	if _, err := Decode([]byte{0}); err == nil {
		t.Error("a short message decoded")
	}
}

func TestNames(t *testing.T) {
	if err := checkName("steelyard_localhost_nps"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "a-name-that-is-longer-than-31-chars"} {
		if err := checkName(bad); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
}
