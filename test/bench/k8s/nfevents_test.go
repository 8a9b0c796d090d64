package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// readCapture returns the datagrams of testdata/<name>.hex, written by
// TestCaptureNFTEvents (capture_test.go) from the kernel's notifications.
func readCapture(t *testing.T, name string) [][]byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".hex"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		b, err := hex.DecodeString(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// events parses every datagram of a capture.
func events(t *testing.T, name string) []nftEvent {
	var out []nftEvent
	for _, d := range readCapture(t, name) {
		out = append(out, parseNFTMessages(d)...)
	}
	return out
}

// addrsOf returns the addresses of the events of kind msg in table.
func addrsOf(evs []nftEvent, msg uint8, table string) (n int, addrs []netip.Addr) {
	for _, ev := range evs {
		if ev.msg == msg && ev.table == table {
			n++
			for _, a := range ev.addrs {
				if !slices.Contains(addrs, a) {
					addrs = append(addrs, a)
				}
			}
		}
	}
	return n, addrs
}

// kube-proxy's layout: the endpoint's address is in both rules of its
// endpoint chain (the saddr match and the dnat), per the capture's script.
func TestParseEndpointChain(t *testing.T) {
	evs := events(t, "endpoint-chain")
	want := netip.MustParseAddr("198.19.128.7")
	if n, addrs := addrsOf(evs, nftMsgNewRule, "kube-proxy"); n != 2 || !slices.Equal(addrs, []netip.Addr{want}) {
		t.Errorf("NEWRULE kube-proxy: %d messages, addresses %v; want 2, [%v]", n, addrs, want)
	}
	if n, addrs := addrsOf(evs, nftMsgNewChain, "kube-proxy"); n != 2 || len(addrs) != 0 {
		t.Errorf("NEWCHAIN kube-proxy: %d messages, addresses %v; want 2, none", n, addrs)
	}
	// Two transactions: the script, and the table's deletion.
	if n, _ := addrsOf(evs, nftMsgNewGen, ""); n != 2 {
		t.Errorf("NEWGEN: %d, want 2", n)
	}
}

// The map-element layout: the endpoint is the value `addr . port` of an
// element, in a NEWSETELEM; the rule that reads the map holds no address.
func TestParseMapElement(t *testing.T) {
	evs := events(t, "map-element")
	want := netip.MustParseAddr("198.19.128.9")
	if n, addrs := addrsOf(evs, nftMsgNewSetElem, "steelyard"); n != 1 || !slices.Equal(addrs, []netip.Addr{want}) {
		t.Errorf("NEWSETELEM steelyard: %d messages, addresses %v; want 1, [%v]", n, addrs, want)
	}
	if n, addrs := addrsOf(evs, nftMsgNewRule, "steelyard"); n != 1 || len(addrs) != 0 {
		t.Errorf("NEWRULE steelyard: %d messages, addresses %v; want 1, none", n, addrs)
	}
}

// Deletions carry the old address too; they must not count as arrivals.
func TestParseSkipsDeletions(t *testing.T) {
	for _, d := range readCapture(t, "endpoint-chain") {
		d = slices.Clone(d)
		for off := 0; off+nlmsgHdrLen <= len(d); {
			n := int(binary.NativeEndian.Uint32(d[off:]))
			if typ := binary.NativeEndian.Uint16(d[off+4:]); typ == nfnlSubsysNFTables<<8|nftMsgNewRule {
				binary.NativeEndian.PutUint16(d[off+4:], nfnlSubsysNFTables<<8|8) // NFT_MSG_DELRULE
			}
			off += align(n)
		}
		for _, ev := range parseNFTMessages(d) {
			if ev.msg == nftMsgNewRule || len(ev.addrs) > 0 {
				t.Errorf("a deletion parsed as %+v", ev)
			}
		}
	}
}

// Truncated or corrupted datagrams are dropped, never a panic.
func TestParseShortInput(t *testing.T) {
	for _, name := range []string{"endpoint-chain", "map-element"} {
		for _, d := range readCapture(t, name) {
			for n := range len(d) {
				parseNFTMessages(d[:n])
				c := slices.Clone(d)
				c[n] ^= 0xff
				parseNFTMessages(c)
			}
		}
	}
}

// An address must start on a 4-byte boundary: the same bytes one byte
// off are not an address (they would be the tail of another field).
func TestPodAddrsAligned(t *testing.T) {
	b := []byte{0, 198, 19, 128, 1, 0, 0, 0, 198, 19, 128, 2, 198, 19, 128, 2}
	if got, want := podAddrs(b), []netip.Addr{netip.MustParseAddr("198.19.128.2")}; !slices.Equal(got, want) {
		t.Errorf("podAddrs = %v, want %v", got, want)
	}
}

// The listener's bookkeeping over a capture: the address arrives once, at
// the receipt time of its first message; another table's events and the
// canary are kept apart.
func TestListenerRecord(t *testing.T) {
	l := &nftListener{table: "kube-proxy", seen: map[netip.Addr]time.Time{}, added: make(chan struct{}), done: make(chan struct{})}
	t0 := time.Unix(1000, 0)
	for i, d := range readCapture(t, "endpoint-chain") {
		l.record(parseNFTMessages(d), t0.Add(time.Duration(i)*time.Millisecond))
	}
	for _, d := range readCapture(t, "map-element") {
		l.record(parseNFTMessages(d), t0.Add(time.Hour))
	}
	a := netip.MustParseAddr("198.19.128.7")
	first := -1
	for i, d := range readCapture(t, "endpoint-chain") {
		for _, ev := range parseNFTMessages(d) {
			if first < 0 && slices.Contains(ev.addrs, a) {
				first = i
			}
		}
	}
	if got, want := l.seen[a], t0.Add(time.Duration(first)*time.Millisecond); !got.Equal(want) {
		t.Errorf("198.19.128.7 seen at %v, want %v (datagram %d)", got, want, first)
	}
	if _, ok := l.seen[netip.MustParseAddr("198.19.128.9")]; ok {
		t.Error("an address of table steelyard was recorded for kube-proxy")
	}
	if l.canary {
		t.Error("canary set without the canary table")
	}
	st := l.stats()
	if st.messages != 4 || st.gens != 4 {
		t.Errorf("stats %+v, want 4 messages of kube-proxy (2 chains, 2 rules) and 4 NEWGEN", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if got, err := l.wait(ctx, "198.19.128.7"); err != nil || !got.Equal(l.seen[a]) {
		t.Errorf("wait = %v, %v", got, err)
	}
}
