package nfacct

import (
	"encoding/binary"
	"syscall"
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

// A create request as libnetfilter_acct's nfacct_add writes it: netlink
// header, nfgenmsg (AF_UNSPEC, version 0, resource 0), the NUL-terminated
// name padded to 4 bytes.
func TestAppendRequest(t *testing.T) {
	b := appendRequest(nil, msgNew, 0x405, 7, "sy-ep-ab")
	want := make([]byte, 0, 36)
	ne := binary.NativeEndian
	want = ne.AppendUint32(want, 36)
	want = ne.AppendUint16(want, 7<<8|0)
	want = ne.AppendUint16(want, 0x405)
	want = ne.AppendUint32(want, 7)
	want = ne.AppendUint32(want, 0)
	want = append(want, 0, 0, 0, 0)
	want = append(want, attr(attrName, []byte("sy-ep-ab\x00"))...)
	if string(b) != string(want) {
		t.Fatalf("request\n got %x\nwant %x", b, want)
	}
	// Appended after another, each keeps its own length; a dump has no
	// attribute.
	b = appendRequest(b, msgGet, 0x301, 8, "")
	msgs, err := parseMessages(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(msgs) != 2 || msgs[0].seq != 7 || msgs[1].seq != 8 || msgs[1].typ != 7<<8|msgGet || msgs[1].flags != 0x301 || len(msgs[1].data) != sizeofNfgen {
		t.Errorf("parsed %+v", msgs)
	}
	// Every name length pads to a multiple of 4.
	for n := 1; n <= MaxNameLen; n++ {
		r := appendRequest(nil, msgDel, 0, 1, string(make([]byte, n)))
		if len(r)%4 != 0 || int(ne.Uint32(r)) != len(r) {
			t.Errorf("name of %d bytes: request of %d bytes, header says %d", n, len(r), ne.Uint32(r))
		}
	}
}

// nlmsg encodes one kernel message: header and payload, padded.
func nlmsg(typ uint16, seq uint32, payload []byte) []byte {
	ne := binary.NativeEndian
	b := ne.AppendUint32(nil, uint32(sizeofHeader+len(payload)))
	b = ne.AppendUint16(b, typ)
	b = ne.AppendUint16(b, 0)
	b = ne.AppendUint32(b, seq)
	b = ne.AppendUint32(b, 0)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// errPayload is an NLMSG_ERROR payload with the request capped to its
// header (NETLINK_CAP_ACK).
func errPayload(errno int32, seq uint32) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(errno))
	return append(b, nlmsg(7<<8, seq, nil)...)
}

// Acks of a batch, as one datagram may hold several: each is decoded to
// its errno, and a cut-off buffer is an error, not a silent short read.
func TestParseAcks(t *testing.T) {
	b := nlmsg(2, 10, errPayload(0, 10))                // NLMSG_ERROR 0: created
	b = append(b, nlmsg(2, 11, errPayload(-16, 11))...) // EBUSY: existed
	b = append(b, nlmsg(2, 12, errPayload(-2, 12))...)  // ENOENT
	msgs, err := parseMessages(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []syscall.Errno{0, syscall.EBUSY, syscall.ENOENT}
	if len(msgs) != len(want) {
		t.Fatalf("%d messages, want %d", len(msgs), len(want))
	}
	for i, m := range msgs {
		e, err := ackErrno(m.data)
		if err != nil || e != want[i] || m.seq != uint32(10+i) {
			t.Errorf("ack %d: seq %d errno %v (%v), want seq %d errno %v", i, m.seq, e, err, 10+i, want[i])
		}
	}
	for _, cut := range []int{1, 15, len(b) - 4} {
		if _, err := parseMessages(b[:cut]); err == nil {
			t.Errorf("a buffer cut to %d bytes parsed", cut)
		}
	}
	if _, err := ackErrno([]byte{1, 2}); err == nil {
		t.Error("a 2-byte error payload decoded")
	}
}

// A dump's data message decodes to its counter: the payload parseMessages
// hands on is what Decode takes.
func TestParseDumpMessage(t *testing.T) {
	payload := []byte{0, 0, 0, 0}
	payload = append(payload, attr(attrName, []byte("sy-ep-x\x00"))...)
	payload = append(payload, attr(attrPkts, be64(5))...)
	payload = append(payload, attr(attrBytes, be64(300))...)
	b := append(nlmsg(7<<8|msgNew, 3, payload), nlmsg(3, 3, []byte{0, 0, 0, 0})...) // then NLMSG_DONE
	msgs, err := parseMessages(b)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("%d messages, %v", len(msgs), err)
	}
	c, err := Decode(msgs[0].data)
	if err != nil || c != (Counter{Name: "sy-ep-x", Packets: 5, Bytes: 300}) {
		t.Errorf("decoded %+v, %v", c, err)
	}
	if msgs[1].typ != 3 {
		t.Errorf("last message of type %d, want NLMSG_DONE", msgs[1].typ)
	}
}
