//go:build e2e

package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// With the default --full-sync-period (an hour), periodic syncs are
// partial: a hand edit stays until the next full sync, but a firewall
// reload that flushes the tables is seen at the next periodic sync (the
// canary rule is gone) and repaired by a full sync at once.
func casePeriodicSyncRepairsFlushedTables(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.noClusterCIDR = true
	f.addPods(webService)
	f.write("web.yaml", webService)
	f.start("--sync-period", "1s")
	if m.flavour == "" {
		nftRepairsFlush(t, f)
		return
	}
	ipt := func(args ...string) {
		t.Helper()
		if _, err := f.sb.Node.Exec(append([]string{iptablesCmd(f.m.flavour, "iptables")}, args...)...); err != nil {
			t.Fatal(err)
		}
	}

	save, err := f.sb.Node.Exec(iptablesCmd(f.m.flavour, "iptables-save"), "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	match := regexp.MustCompile(`-A STEELYARD-SERVICES .*"e2e/web:tcp".* -j (STEELYARD-SVC-[A-Z0-9]+)`).FindStringSubmatch(save)
	if match == nil {
		t.Fatalf("no Service chain for e2e/web:tcp in:\n%s", save)
	}
	// A hand edit: three periodic syncs later it is still there (they
	// write only what changed in the desired state: nothing).
	ipt("-t", "nat", "-D", match[1], "1")
	time.Sleep(3500 * time.Millisecond)
	out, code := f.verify()
	if code != 1 {
		t.Fatalf("verify exit %d 3.5 s after a hand edit with --full-sync-period 1h, want 1 (periodic syncs are partial):\n%s", code, out)
	}
	if n := strings.Count(f.agent.Log(), "full=true"); n != 1 {
		t.Errorf("%d full syncs, want only the first", n)
	}

	// A firewall reload: every rule and user chain of both tables goes.
	logBefore := len(f.agent.Log())
	flushed := time.Now()
	for _, table := range []string{"filter", "nat"} {
		ipt("-t", table, "-F")
		ipt("-t", table, "-X")
	}
	f.waitVerify(5 * time.Second)
	t.Logf("flushed tables repaired after %s", time.Since(flushed).Round(time.Millisecond))
	if !strings.Contains(f.agent.Log()[logBefore:], "canary rule missing") {
		t.Errorf("the agent did not log the missing canary:\n%s", f.agent.Log()[logBefore:])
	}
}

// nftRepairsFlush is the nftables branch of
// casePeriodicSyncRepairsFlushedTables: a hand edit inside the table stays
// through the periodic (partial) syncs, and "nft flush ruleset" is
// repaired by the next one, which finds the table gone.
func nftRepairsFlush(t *testing.T, f *fixture) {
	t.Helper()
	nft := func(args ...string) {
		t.Helper()
		if _, err := f.sb.Node.Exec(append([]string{"nft"}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	nft("delete", "element", "ip", "steelyard", "service-ips", "{ 198.18.0.10 . tcp . 80 }")
	time.Sleep(3500 * time.Millisecond)
	out, code := f.verify()
	if code != 1 {
		t.Fatalf("verify exit %d 3.5 s after a hand edit with --full-sync-period 1h, want 1 (periodic syncs are partial):\n%s", code, out)
	}
	if n := agentFullSyncs(f.agent.Log()); n != 1 {
		t.Errorf("%d full syncs, want only the first", n)
	}
	logBefore := len(f.agent.Log())
	flushed := time.Now()
	nft("flush", "ruleset")
	f.waitVerify(5 * time.Second)
	t.Logf("flushed ruleset repaired after %s", time.Since(flushed).Round(time.Millisecond))
	if !strings.Contains(f.agent.Log()[logBefore:], "is gone (flushed?)") {
		t.Errorf("the agent did not log the missing table:\n%s", f.agent.Log()[logBefore:])
	}
}

// agentFullSyncs counts the agent's full syncs in its log (the agent's own
// summary line; dataplanes log theirs per IP family).
func agentFullSyncs(log string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "full=true") && strings.Contains(l, "subsys=agent") {
			n++
		}
	}
	return n
}
