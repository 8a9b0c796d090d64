//go:build capture

package main

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestCaptureNFTEvents writes testdata/*.hex, the notifications the kernel
// sends for the two endpoint layouts parse_test.go reads: kube-proxy's
// endpoint chain (`ip saddr A jump ...`, `dnat to A:8080`) and a map whose
// element value is `addr . port`. Root, in a namespace of its own:
//
//	go test -tags capture -run TestCaptureNFTEvents ./test/bench/k8s
func TestCaptureNFTEvents(t *testing.T) {
	if !sandbox.IsRoot() {
		t.Skip("needs root")
	}
	s, err := sandbox.New(sandbox.Options{Prefix: "sykc", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct{ name, script string }{
		{"endpoint-chain", `add table ip kube-proxy
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy endpoint-ABC
add rule ip kube-proxy endpoint-ABC ip saddr 198.19.128.7 jump mark-for-masquerade
add rule ip kube-proxy endpoint-ABC meta l4proto tcp dnat to 198.19.128.7:8080
`},
		{"map-element", `add table ip steelyard
add map ip steelyard endpoints { type mark : ipv4_addr . inet_service ; }
add element ip steelyard endpoints { 0x00000011 : 198.19.128.9 . 8080 }
add chain ip steelyard svc
add rule ip steelyard svc meta l4proto tcp dnat ip to meta mark map @endpoints
`},
	} {
		var mu sync.Mutex
		var lines []string
		l, err := startNFTListenerRaw(s.Node, "", func(b []byte) {
			mu.Lock()
			lines = append(lines, hex.EncodeToString(b))
			mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Exec(s.Node, "sh", "-c", "printf '%s' '"+c.script+"' | nft -f - && nft delete table ip "+strings.Fields(c.script)[3]); err != nil {
			l.stop()
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		l.stop()
		mu.Lock()
		out := strings.Join(lines, "\n") + "\n"
		mu.Unlock()
		if err := os.WriteFile(filepath.Join("testdata", c.name+".hex"), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d datagrams", c.name, len(lines))
	}
}
