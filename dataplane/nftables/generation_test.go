package nftables

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// newgen builds a NFT_MSG_NEWGEN reply as the kernel sends it: the
// generation id, then the pid and name of the last committer.
func newgen(id uint32) []byte {
	attr := func(typ uint16, v []byte) []byte {
		b := make([]byte, 4, 4+len(v)+3)
		binary.NativeEndian.PutUint16(b, uint16(4+len(v)))
		binary.NativeEndian.PutUint16(b[2:], typ)
		b = append(b, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	var attrs []byte
	attrs = append(attrs, attr(unix.NFTA_GEN_ID, binary.BigEndian.AppendUint32(nil, id))...)
	attrs = append(attrs, attr(unix.NFTA_GEN_PROC_PID, binary.BigEndian.AppendUint32(nil, 4242))...)
	attrs = append(attrs, attr(unix.NFTA_GEN_PROC_NAME, []byte("nft\x00"))...)
	b := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(attrs))
	b = append(b, attrs...)
	binary.NativeEndian.PutUint32(b, uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN)
	return b
}

func TestParseGeneration(t *testing.T) {
	got, err := parseGeneration(newgen(0x01020304))
	if err != nil || got != 0x01020304 {
		t.Fatalf("parseGeneration = %#x, %v; want 0x1020304", got, err)
	}
	errMsg := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint16(errMsg[4:], unix.NLMSG_ERROR)
	e := int32(-int32(unix.EPERM))
	binary.NativeEndian.PutUint32(errMsg[unix.NLMSG_HDRLEN:], uint32(e))
	if _, err := parseGeneration(errMsg); !errors.Is(err, unix.EPERM) {
		t.Errorf("error reply: got %v, want EPERM", err)
	}
	if _, err := parseGeneration(newgen(1)[:10]); err == nil {
		t.Error("short reply: no error")
	}
}

// TestGenerationCustody: the full resync may skip its listing only while
// every commit since the last listing was ours and moved the generation
// by one.
func TestGenerationCustody(t *testing.T) {
	kernel := uint32(7)
	g := generation{read: func() (uint32, error) { return kernel, nil }}
	if g.unchanged() {
		t.Fatal("never listed: unchanged")
	}
	g.listed(kernel, nil)
	commit := func(foreignBefore, foreignAfter bool) {
		if foreignBefore {
			kernel++
		}
		gen0, ok := g.before()
		kernel++ // ours
		if foreignAfter {
			kernel++
		}
		g.after(gen0, ok, true)
	}
	commit(false, false)
	if !g.unchanged() {
		t.Fatal("only our commit: not unchanged")
	}
	kernel++ // someone else commits
	if g.unchanged() {
		t.Fatal("foreign commit after ours: unchanged")
	}
	g.listed(kernel, nil)
	commit(true, false)
	if g.unchanged() {
		t.Error("foreign commit before ours: unchanged")
	}
	g.listed(kernel, nil)
	commit(false, true)
	if g.unchanged() {
		t.Error("foreign commit right after ours: unchanged")
	}
	g.listed(kernel, nil)
	gen0, ok := g.before()
	g.after(gen0, ok, false) // a failed commit
	if g.unchanged() {
		t.Error("failed commit: unchanged")
	}
}
