// Package ebpf is steelyard's --mode ebpf: cgroup socket programs
// (bpf/socklb.c) that choose a Service port's backend when a local
// process connects or sends, composed with the nftables dataplane for the
// entry points no local socket starts (node ports, external and
// load-balancer IPs; docs/dataplanes.md says why).
//
// This file holds the map layouts as Go encoders: one place that turns
// the desired state into the bytes the programs read, and the kernel's
// bytes back into the model for explain. The layouts are those of
// bpf/socklb.c; TestLayouts checks them against the structs bpf2go
// generated from its BTF.
package ebpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// IP protocol numbers as the services key holds them.
const (
	protoTCP = 6
	protoUDP = 17
)

// Sizes of the encoded keys and values (those of the C structs).
const (
	svcKeySize    = 20
	svcValSize    = 16
	slotKeySize   = 8 // putPair
	backendSize   = 20
	revnatKeySize = 32
	countKeySize  = svcKeySize + backendSize
	nameSize      = 128 // struct svc_name: dataplane.NftCommentMax
)

// svcKey is a key of the services map: a VIP. Addresses are 16 bytes, IPv4
// as ::ffff:a.b.c.d (netip.Addr.As16), so one layout serves both families.
type svcKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto uint8
}

// svcKeyOf returns the key of a VIP; false for a protocol the socket
// programs do not serve (SCTP: its connect() is not hooked the same way).
func svcKeyOf(v dataplane.VIP) (svcKey, bool) {
	k := svcKey{Addr: v.IP, Port: v.Port}
	switch v.Protocol {
	case dataplane.TCP:
		k.Proto = protoTCP
	case dataplane.UDP:
		k.Proto = protoUDP
	default:
		return svcKey{}, false
	}
	return k, true
}

// protocol returns the model's protocol of the key.
func (k svcKey) protocol() dataplane.Protocol {
	if k.Proto == protoUDP {
		return dataplane.UDP
	}
	return dataplane.TCP
}

// putAddr writes a 16-byte address and a network-order port, the layout
// that svc_key, backend and revnat_key share.
func putAddrPort(b []byte, a netip.Addr, port uint16) {
	a16 := a.As16()
	copy(b[:16], a16[:])
	binary.BigEndian.PutUint16(b[16:18], port)
}

// addrPortAt reads what putAddrPort wrote. A v4-mapped address comes back
// as IPv4.
func addrPortAt(b []byte) (netip.Addr, uint16) {
	return netip.AddrFrom16([16]byte(b[:16])).Unmap(), binary.BigEndian.Uint16(b[16:18])
}

// MarshalBinary encodes the key as struct svc_key.
func (k svcKey) MarshalBinary() ([]byte, error) {
	if !k.Addr.IsValid() {
		return nil, fmt.Errorf("services key: invalid address")
	}
	b := make([]byte, svcKeySize)
	putAddrPort(b, k.Addr, k.Port)
	b[18] = k.Proto
	return b, nil
}

// UnmarshalBinary decodes struct svc_key.
func (k *svcKey) UnmarshalBinary(b []byte) error {
	if len(b) != svcKeySize {
		return fmt.Errorf("services key: %d bytes, want %d", len(b), svcKeySize)
	}
	k.Addr, k.Port = addrPortAt(b)
	k.Proto = b[18]
	return nil
}

// svcVal is a value of the services map: the Service port's slot table
// and its affinity.
type svcVal struct {
	// ID names the table in the slots map. A changed port gets a new
	// table under a fresh ID, and the services entry switches to it in
	// one update: a connect never sees half a table.
	ID uint32
	// Count is how many slots the table has (>= 1).
	Count uint32
	// Affinity is the sessionAffinity ClientIP timeout in seconds (0:
	// none).
	Affinity uint32
}

// slot_key is two 32-bit words in host byte order (svc_val four).
func putPair(a, b uint32) []byte {
	out := make([]byte, 8)
	binary.NativeEndian.PutUint32(out[0:4], a)
	binary.NativeEndian.PutUint32(out[4:8], b)
	return out
}

func pairAt(what string, b []byte) (uint32, uint32, error) {
	if len(b) != 8 {
		return 0, 0, fmt.Errorf("%s: %d bytes, want 8", what, len(b))
	}
	return binary.NativeEndian.Uint32(b[0:4]), binary.NativeEndian.Uint32(b[4:8]), nil
}

// MarshalBinary encodes struct svc_val (host byte order, as the program
// reads it; the pad word zero).
func (v svcVal) MarshalBinary() ([]byte, error) {
	return append(putPair(v.ID, v.Count), putPair(v.Affinity, 0)...), nil
}

// UnmarshalBinary decodes struct svc_val.
func (v *svcVal) UnmarshalBinary(b []byte) (err error) {
	if len(b) != svcValSize {
		return fmt.Errorf("services value: %d bytes, want %d", len(b), svcValSize)
	}
	v.ID, v.Count, _ = pairAt("services value", b[:8])
	v.Affinity = binary.NativeEndian.Uint32(b[8:12])
	return nil
}

// slotKey is a key of the slots map: one slot of one table.
type slotKey struct {
	ID   uint32
	Slot uint32
}

// MarshalBinary encodes struct slot_key.
func (k slotKey) MarshalBinary() ([]byte, error) { return putPair(k.ID, k.Slot), nil }

// UnmarshalBinary decodes struct slot_key.
func (k *slotKey) UnmarshalBinary(b []byte) (err error) {
	k.ID, k.Slot, err = pairAt("slots key", b)
	return err
}

// backendVal is a value of the slots map (and of revnat, which holds the
// VIP a socket was sent away from): an address and port.
type backendVal struct {
	Addr netip.Addr
	Port uint16
}

// MarshalBinary encodes struct backend.
func (v backendVal) MarshalBinary() ([]byte, error) {
	if !v.Addr.IsValid() {
		return nil, fmt.Errorf("backend: invalid address")
	}
	b := make([]byte, backendSize)
	putAddrPort(b, v.Addr, v.Port)
	return b, nil
}

// UnmarshalBinary decodes struct backend.
func (v *backendVal) UnmarshalBinary(b []byte) error {
	if len(b) != backendSize {
		return fmt.Errorf("backend: %d bytes, want %d", len(b), backendSize)
	}
	v.Addr, v.Port = addrPortAt(b)
	return nil
}

// addrPort returns the backend as an address and port.
func (v backendVal) addrPort() netip.AddrPort { return netip.AddrPortFrom(v.Addr, v.Port) }

// countKey is a key of the counts map: a VIP and one of its backends. It
// names no table or slot, so a count outlives the switch to a new table.
type countKey struct {
	VIP     svcKey
	Backend backendVal
}

// MarshalBinary encodes struct count_key.
func (k countKey) MarshalBinary() ([]byte, error) {
	v, err := k.VIP.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("counts key: %w", err)
	}
	b, err := k.Backend.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("counts key: %w", err)
	}
	return append(v, b...), nil
}

// UnmarshalBinary decodes struct count_key.
func (k *countKey) UnmarshalBinary(b []byte) error {
	if len(b) != countKeySize {
		return fmt.Errorf("counts key: %d bytes, want %d", len(b), countKeySize)
	}
	if err := k.VIP.UnmarshalBinary(b[:svcKeySize]); err != nil {
		return err
	}
	return k.Backend.UnmarshalBinary(b[svcKeySize:])
}

// nameVal is a value of the names map: a Service port's name as the
// nftables comments hold it (dataplane.ShortName within nameSize bytes),
// NUL-padded (a name of exactly nameSize bytes has no NUL).
type nameVal string

// MarshalBinary encodes struct svc_name. A longer name is refused
// (desiredTables shortens every name first).
func (n nameVal) MarshalBinary() ([]byte, error) {
	if len(n) > nameSize || strings.IndexByte(string(n), 0) >= 0 {
		return nil, fmt.Errorf("names value: %d bytes or a NUL in %q", len(n), string(n))
	}
	b := make([]byte, nameSize)
	copy(b, n)
	return b, nil
}

// UnmarshalBinary decodes struct svc_name: the bytes before the first NUL.
func (n *nameVal) UnmarshalBinary(b []byte) error {
	if len(b) != nameSize {
		return fmt.Errorf("names value: %d bytes, want %d", len(b), nameSize)
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	*n = nameVal(b)
	return nil
}

// member is a value of the members map: the key's presence is what
// counts (a backend of a ClientIP affinity port).
type member struct{}

// MarshalBinary encodes the members map's one-byte value.
func (member) MarshalBinary() ([]byte, error) { return []byte{1}, nil }

// UnmarshalBinary decodes it.
func (*member) UnmarshalBinary(b []byte) error {
	if len(b) != 1 {
		return fmt.Errorf("members value: %d bytes, want 1", len(b))
	}
	return nil
}
