package ebpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/steelyard-net/steelyard/dataplane"
)

// TestLayouts checks the Go encoders against the structs bpf2go generated
// from the programs' BTF: sizes, and the bytes of one value of each.
func TestLayouts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"svc_key", svcKeySize, unsafe.Sizeof(socklbSvcKey{})},
		{"svc_val", svcValSize, unsafe.Sizeof(socklbSvcVal{})},
		{"slot_key", slotKeySize, unsafe.Sizeof(socklbSlotKey{})},
		{"backend", backendSize, unsafe.Sizeof(socklbBackend{})},
		{"revnat_key", revnatKeySize, unsafe.Sizeof(socklbRevnatKey{})},
		{"count_key", countKeySize, unsafe.Sizeof(socklbCountKey{})},
		{"members value", 1, unsafe.Sizeof(uint8(0))},
		{"svc_name", nameSize, unsafe.Sizeof(socklbSvcName{})},
		{"svc_name (nft comments)", nameSize, dataplane.NftCommentMax},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %d bytes encoded, %d in the program", tc.name, tc.got, tc.want)
		}
	}

	// The program reads addresses as four 32-bit words holding the bytes
	// in network order, and the port as the 16-bit network-order value.
	a := netip.MustParseAddr("198.18.0.10").As16()
	var words [4]uint32
	for i := range words {
		words[i] = binary.NativeEndian.Uint32(a[4*i:])
	}
	port := [2]byte{0, 80}
	want := socklbSvcKey{Addr: words, Port: binary.NativeEndian.Uint16(port[:]), Proto: protoTCP}
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, want); err != nil {
		t.Fatal(err)
	}
	got, err := svcKey{Addr: netip.MustParseAddr("198.18.0.10"), Port: 80, Proto: protoTCP}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("svc_key of 198.18.0.10:80/TCP:\n got %x\nwant %x", got, buf.Bytes())
	}
	// count_key: the VIP's svc_key, then the backend.
	buf.Reset()
	be := netip.MustParseAddr("198.19.1.2").As16()
	var beWords [4]uint32
	for i := range beWords {
		beWords[i] = binary.NativeEndian.Uint32(be[4*i:])
	}
	bePort := [2]byte{0x1f, 0x90} // 8080
	binary.Write(&buf, binary.NativeEndian, socklbCountKey{Vip: want,
		Be: socklbBackend{Addr: beWords, Port: binary.NativeEndian.Uint16(bePort[:])}})
	ck := countKey{VIP: svcKey{Addr: netip.MustParseAddr("198.18.0.10"), Port: 80, Proto: protoTCP},
		Backend: backendVal{Addr: netip.MustParseAddr("198.19.1.2"), Port: 8080}}
	if got, err := ck.MarshalBinary(); err != nil || !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("count_key:\n got %x (%v)\nwant %x", got, err, buf.Bytes())
	}
	buf.Reset()
	binary.Write(&buf, binary.NativeEndian, socklbSvcVal{Id: 7, Count: 10, Affinity: 10800})
	if got, _ := (svcVal{ID: 7, Count: 10, Affinity: 10800}).MarshalBinary(); !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("svc_val: got %x, want %x", got, buf.Bytes())
	}
	buf.Reset()
	binary.Write(&buf, binary.NativeEndian, socklbSlotKey{Id: 7, Slot: 3})
	if got, _ := (slotKey{ID: 7, Slot: 3}).MarshalBinary(); !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("slot_key: got %x, want %x", got, buf.Bytes())
	}
}

// FuzzMapEncoders: every encoding decodes to what was encoded, and every
// kernel value of the right size decodes and encodes back to its bytes
// (the padding zeroed).
func FuzzMapEncoders(f *testing.F) {
	f.Add([]byte(netip.MustParseAddr("198.18.0.10").AsSlice()), uint16(80), uint8(protoTCP), uint32(1), uint32(10))
	f.Add([]byte(netip.MustParseAddr("2001:2::10").AsSlice()), uint16(53), uint8(protoUDP), uint32(0), uint32(4096))
	f.Add(make([]byte, 20), uint16(0), uint8(0), uint32(1<<31), uint32(0))
	f.Add(make([]byte, countKeySize), uint16(1), uint8(protoUDP), uint32(2), uint32(3))
	f.Add([]byte("default/web:http"), uint16(8080), uint8(protoTCP), uint32(0), uint32(1))
	f.Fuzz(func(t *testing.T, raw []byte, port uint16, proto uint8, id, n uint32) {
		// Model -> bytes -> model.
		if addr, ok := netip.AddrFromSlice(raw); ok {
			addr = addr.Unmap()
			k := svcKey{Addr: addr, Port: port, Proto: proto}
			b, err := k.MarshalBinary()
			if err != nil || len(b) != svcKeySize {
				t.Fatalf("encode %+v: %v (%d bytes)", k, err, len(b))
			}
			var back svcKey
			if err := back.UnmarshalBinary(b); err != nil || back != k {
				t.Fatalf("svc_key %+v came back as %+v (%v)", k, back, err)
			}
			be := backendVal{Addr: addr, Port: port}
			b, _ = be.MarshalBinary()
			var beBack backendVal
			if err := beBack.UnmarshalBinary(b); err != nil || beBack != be {
				t.Fatalf("backend %+v came back as %+v (%v)", be, beBack, err)
			}
			ck := countKey{VIP: k, Backend: backendVal{Addr: addr, Port: ^port}}
			b, err = ck.MarshalBinary()
			var ckBack countKey
			if err != nil || len(b) != countKeySize || ckBack.UnmarshalBinary(b) != nil || ckBack != ck {
				t.Fatalf("count_key %+v came back as %+v (%v)", ck, ckBack, err)
			}
		}
		// Names: any string that fits and has no NUL comes back.
		if nv := nameVal(raw); len(raw) <= nameSize && !bytes.Contains(raw, []byte{0}) {
			b, err := nv.MarshalBinary()
			var back nameVal
			if err != nil || back.UnmarshalBinary(b) != nil || back != nv {
				t.Fatalf("name %q came back as %q (%v)", raw, back, err)
			}
		} else if _, err := nv.MarshalBinary(); err == nil {
			t.Fatalf("name %q (%d bytes) accepted", raw, len(raw))
		}
		v := svcVal{ID: id, Count: n, Affinity: id ^ n}
		b, _ := v.MarshalBinary()
		var vBack svcVal
		if err := vBack.UnmarshalBinary(b); err != nil || vBack != v {
			t.Fatalf("svc_val %+v came back as %+v", v, vBack)
		}
		// Kernel bytes -> model -> bytes.
		if len(raw) >= svcKeySize {
			in := bytes.Clone(raw[:svcKeySize])
			in[19] = 0 // pad
			var k svcKey
			if err := k.UnmarshalBinary(in); err != nil {
				t.Fatal(err)
			}
			out, err := k.MarshalBinary()
			if err != nil || !bytes.Equal(out, in) {
				t.Fatalf("svc_key bytes %x came back as %x (%v)", in, out, err)
			}
			in = bytes.Clone(raw[:backendSize])
			in[18], in[19] = 0, 0
			var be backendVal
			if err := be.UnmarshalBinary(in); err != nil {
				t.Fatal(err)
			}
			if out, _ := be.MarshalBinary(); !bytes.Equal(out, in) {
				t.Fatalf("backend bytes %x came back as %x", in, out)
			}
		}
		if len(raw) >= countKeySize {
			in := bytes.Clone(raw[:countKeySize])
			in[19], in[38], in[39] = 0, 0, 0 // pads
			var ck countKey
			if err := ck.UnmarshalBinary(in); err != nil {
				t.Fatal(err)
			}
			if out, _ := ck.MarshalBinary(); !bytes.Equal(out, in) {
				t.Fatalf("count_key bytes %x came back as %x", in, out)
			}
		}
		// Wrong sizes are refused, never read past.
		var k svcKey
		if len(raw) != svcKeySize && k.UnmarshalBinary(raw) == nil {
			t.Fatalf("svc_key of %d bytes accepted", len(raw))
		}
		var ck countKey
		if len(raw) != countKeySize && ck.UnmarshalBinary(raw) == nil {
			t.Fatalf("count_key of %d bytes accepted", len(raw))
		}
		var nv nameVal
		if len(raw) != nameSize && nv.UnmarshalBinary(raw) == nil {
			t.Fatalf("svc_name of %d bytes accepted", len(raw))
		}
	})
}
