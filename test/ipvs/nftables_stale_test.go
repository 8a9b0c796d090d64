//go:build ipvsvm

package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The nftables part of the VM suite: the VM boots Debian's 6.1 kernel, and
// before 6.2 the kernel drops a chain's use count only after the
// transaction that removed the last map element pointing at it (kube-proxy
// flushes stale chains and deletes them a second later). These tests
// record what 6.1 does and check that the agent's own way (unused objects
// left intact, flushed and deleted StaleDelay later) never fails a sync.

// TestNftablesStaleChainsKernel records, with nft alone in a namespace of
// its own, which ways of removing a chain and the map element that jumps to
// it this kernel accepts. It fails only if the way steelyard uses fails.
func TestNftablesStaleChainsKernel(t *testing.T) {
	if steelyardBin == "" {
		t.Skip("runs inside the VM (scripts/vm/test-ipvs.sh)")
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	nft := func(script string) error {
		f := filepath.Join(t.TempDir(), "tx.nft")
		if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := sb.Node.Exec("nft", "-f", f)
		if err != nil {
			return fmt.Errorf("%v: %s", err, strings.TrimSpace(out))
		}
		return nil
	}
	// Each case: a vmap (plain, and an interval concatenation like
	// steelyard's weight maps) whose element jumps to a chain; then the
	// removal steps, each its own transaction.
	maps := map[string]string{
		"plain vmap": `map m { type ipv4_addr : verdict ; elements = { 198.18.9.1 : goto c } }
	chain pre {
		type nat hook prerouting priority -100 ; ip daddr vmap @m
	}`,
		"interval numgen vmap": `map m { typeof numgen random mod 2 . meta l4proto : verdict ; flags interval ; elements = { 0-1 . tcp : goto c } }
	chain pre {
		type nat hook prerouting priority -100 ; numgen random mod 2 . meta l4proto vmap @m
	}`,
	}
	del := map[string]string{
		"plain vmap":           "delete element ip probe m { 198.18.9.1 }\n",
		"interval numgen vmap": "delete element ip probe m { 0-1 . tcp }\n",
	}
	ways := []struct {
		name  string
		steps func(delElem string) []string
		// ours: the order the agent uses; it must work.
		ours bool
	}{
		{"element and chain deleted in one transaction", func(d string) []string {
			return []string{d + "delete chain ip probe c\n"}
		}, false},
		{"element deleted, chain deleted in the next transaction at once", func(d string) []string {
			return []string{d, "delete chain ip probe c\n"}
		}, false},
		{"element deleted (chain kept), chain flushed and deleted a second later", func(d string) []string {
			return []string{d, "sleep", "flush chain ip probe c\ndelete chain ip probe c\n"}
		}, true},
	}
	for name, m := range maps {
		for _, w := range ways {
			if err := nft("table ip probe {\n\tchain c {\n\t\tmeta l4proto tcp dnat to 198.19.9.1:8080\n\t}\n\t" + m + "\n}\n"); err != nil {
				t.Fatalf("%s: set-up: %v", name, err)
			}
			var failed error
			for i, s := range w.steps(del[name]) {
				if s == "sleep" {
					time.Sleep(time.Second)
					continue
				}
				if err := nft(s); err != nil {
					failed = fmt.Errorf("step %d: %w", i+1, err)
					break
				}
			}
			if failed != nil {
				t.Logf("%s, %s: refused: %v", name, w.name, failed)
				if w.ours {
					t.Errorf("%s: steelyard's way fails on this kernel: %v", name, failed)
				}
			} else {
				t.Logf("%s, %s: accepted", name, w.name)
			}
			if err := nft("delete table ip probe\n"); err != nil {
				t.Fatalf("tear-down: %v", err)
			}
		}
	}
}

// TestNftablesStaleChainsAgent runs the agent in nftables mode and churns:
// a Service comes and goes and an endpoint leaves and returns, six rounds.
// Every sync must succeed, and what a gone Service used must leave the
// table within a few seconds (StaleDelay plus the requeued sync).
func TestNftablesStaleChainsAgent(t *testing.T) {
	if steelyardBin == "" {
		t.Skip("runs inside the VM (scripts/vm/test-ipvs.sh)")
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct{ name, ip string }{{"drain-1", "198.19.5.2"}, {"drain-2", "198.19.5.3"}} {
		if _, err := sb.AddPod(p.name, netip.MustParseAddr(p.ip), 8080); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{t: t, sb: sb, client: client, dir: t.TempDir()}
	f.write("drain.yaml", drainManifest("drain-1=1,drain-2=1", "drain-1", "drain-2"))
	f.write("gone.yaml", goneManifest)
	a, err := sb.StartAgent(steelyardBin, "run", "--manifests", f.dir, "--mode", "nftables",
		"--cluster-cidr", sandbox.ClusterCIDR.String(), "--log-level", "debug",
		"--metrics-bind-address", "", "--healthz-bind-address", "")
	if err != nil {
		t.Fatal(err)
	}
	chains := func() string {
		out, err := sb.Node.Exec("nft", "list", "table", "ip", "steelyard")
		if err != nil {
			return "" // not written yet
		}
		var names []string
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "chain" {
				names = append(names, f[1])
			}
		}
		return strings.Join(names, "\n")
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !ok() {
			if exited, err := a.Exited(); exited {
				t.Fatalf("agent exited: %v\n%s", err, a.Log())
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after 15 s\nchains:\n%s\nagent log:\n%s", what, chains(), a.Log())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	goneThere := func() bool { return strings.Contains(chains(), "/gone/") }
	waitFor("the gone Service's chains written", goneThere)
	for round := 1; round <= 6; round++ {
		start := time.Now()
		if round%2 == 1 {
			// The Service goes and an endpoint leaves, in one change.
			if err := os.Remove(filepath.Join(f.dir, "gone.yaml")); err != nil {
				t.Fatal(err)
			}
			f.write("drain.yaml", drainManifest("drain-1=1", "drain-1"))
			waitFor("round "+fmt.Sprint(round)+": the gone Service's chains deleted", func() bool { return !goneThere() })
		} else {
			f.write("gone.yaml", goneManifest)
			f.write("drain.yaml", drainManifest("drain-1=1,drain-2=1", "drain-1", "drain-2"))
			waitFor("round "+fmt.Sprint(round)+": the Service back", goneThere)
		}
		t.Logf("round %d: table settled in %s", round, time.Since(start).Round(time.Millisecond))
	}
	r, err := client.TCPConns(netip.MustParseAddrPort(drainVIP+":80"), 200, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the churn: %s", r)
	if r.Failed() > 0 || r.Counts["drain-1"] == 0 || r.Counts["drain-2"] == 0 {
		t.Errorf("the VIP after the churn: %s, want both pods and no failure", r)
	}
	if log := a.Log(); strings.Contains(log, "sync failed") {
		t.Errorf("a sync failed during the churn:\n%s", log)
	}
}

// goneManifest is a Service that comes and goes, over drain-1.
var goneManifest = serviceManifest("gone", "198.18.0.30", "", map[string]string{"drain-1": "198.19.5.2"}, "drain-1")
