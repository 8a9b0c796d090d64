//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestModeSwitchRemovesLeftovers restarts the agent in another mode on the
// same node, as a DaemonSet whose --mode changed: once the new mode's first
// sync is in, the old mode's rules are gone (kube-proxy removes the other
// kernel API's leftovers at start too), and the VIP keeps its weights
// throughout.
func TestModeSwitchRemovesLeftovers(t *testing.T) {
	for _, pair := range [][2]string{
		{"iptables-legacy", "nftables"},
		{"nftables", "iptables-nft"},
		{"iptables-nft", "nftables"},
	} {
		t.Run(pair[0]+"-to-"+pair[1], func(t *testing.T) {
			from, to := modeNamed(t, pair[0]), modeNamed(t, pair[1])
			f := newFixture(t, from)
			f.addPods(webService)
			f.write("web.yaml", webService)
			f.start()
			if err := f.agent.Stop(); err != nil {
				t.Errorf("agent exit on SIGTERM: %v", err)
			}
			if !strings.Contains(strings.Join(from.ruleset(t, f), "\n"), from.marker()) {
				t.Fatalf("no %s rules after the %s agent stopped", from.marker(), from.name)
			}

			f.m = to
			f.start()
			// The cleanup runs right after the first sync, which start
			// waited for (verify passed); give it a moment to finish.
			deadline := time.Now().Add(10 * time.Second)
			for strings.Contains(strings.Join(from.ruleset(t, f), "\n"), from.marker()) {
				if time.Now().After(deadline) {
					t.Fatalf("%s rules still there 10 s after the %s agent synced:\n%s", from.name, to.name, strings.Join(from.ruleset(t, f), "\n"))
				}
				time.Sleep(100 * time.Millisecond)
			}
			if !strings.Contains(strings.Join(to.ruleset(t, f), "\n"), to.marker()) {
				t.Fatalf("the %s agent's own rules are missing", to.name)
			}
			if out, code := f.verify(); code != 0 {
				t.Errorf("verify after the switch: exit %d\n%s", code, out)
			}
			r, err := f.client.TCPConns(addrPort(webService.vip, 80), tcp1090Conns, sandbox.Load{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("10/90 after %s -> %s: %s", from.name, to.name, r)
			sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 1)
		})
	}
}
