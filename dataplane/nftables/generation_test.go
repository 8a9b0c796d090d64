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

// TestGenerationCustody: a family's full resync may skip its listing only
// while every commit since it was listed was ours (either family's) and
// moved the generation by one.
func TestGenerationCustody(t *testing.T) {
	kernel := uint32(7)
	g := newGeneration()
	g.read = func() (uint32, error) { return kernel, nil }
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
	if g.unchanged(4) {
		t.Fatal("never listed: unchanged")
	}
	g.listed(4, kernel, nil)
	commit(false, false)
	if !g.unchanged(4) {
		t.Fatal("only our commit: not unchanged")
	}
	if g.unchanged(6) {
		t.Fatal("IPv6 never listed: unchanged")
	}
	// The IPv6 Proxier lists and commits: IPv4 keeps its custody.
	g.listed(6, kernel, nil)
	commit(false, false)
	if !g.unchanged(4) || !g.unchanged(6) {
		t.Fatalf("both families' own commits: unchanged(4)=%v unchanged(6)=%v", g.unchanged(4), g.unchanged(6))
	}
	kernel++ // someone else commits
	if g.unchanged(4) || g.unchanged(6) {
		t.Fatal("foreign commit after ours: unchanged")
	}
	// IPv6 lists again after the foreign commit: IPv4 must list too (the
	// foreign commit may have changed its table).
	g.listed(6, kernel, nil)
	commit(false, false)
	if !g.unchanged(6) || g.unchanged(4) {
		t.Fatalf("after a foreign commit only the family listed since is known: unchanged(4)=%v unchanged(6)=%v", g.unchanged(4), g.unchanged(6))
	}
	g.listed(4, kernel, nil)
	commit(true, false)
	if g.unchanged(4) {
		t.Error("foreign commit before ours: unchanged")
	}
	g.listed(4, kernel, nil)
	commit(false, true)
	if g.unchanged(4) {
		t.Error("foreign commit right after ours: unchanged")
	}
	g.listed(4, kernel, nil)
	gen0, ok := g.before()
	g.after(gen0, ok, false) // a failed commit
	if g.unchanged(4) {
		t.Error("failed commit: unchanged")
	}
	g.listed(4, kernel, nil)
	g.drop() // Cleanup
	if g.unchanged(4) {
		t.Error("after drop: unchanged")
	}
	// Without a kernel (the fake) nothing is ever skipped.
	f := newGeneration()
	f.listed(4, 1, nil)
	if f.unchanged(4) {
		t.Error("no reader: unchanged")
	}
}
