//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestNftablesUpgradeFromConcatenatedKeys restarts the nftables agent on a
// table written by steelyard before 2026-12-07, whose weight maps were
// keyed "numgen . meta l4proto" ("dm-"/"wm-", issue 21). A map's key type
// cannot change in place: the new agent's first (full) sync must write
// the new maps ("dn-"/"wv-", keyed by the draw alone) and repoint every
// split rule in one transaction, and delete the old maps once unused.
// Connections run from before the restart to after the cleanup: none may
// fail (no port is ever half-reachable), and the shares stay.
//
// The old table is the old binary's when STEELYARD_OLD_BIN names one
// (built from a commit before the change); else this agent's table
// rewritten into the old render's shape (names, typeof, element keys and
// rules, as that render spelled them), which serves the same packets
// (checked below before the restart).
func TestNftablesUpgradeFromConcatenatedKeys(t *testing.T) {
	m := modeNamed(t, "nftables")
	f := newFixture(t, m)
	f.addPods(webService, quadService)
	f.write("web.yaml", webService, quadService)
	if old := os.Getenv("STEELYARD_OLD_BIN"); old != "" {
		saved := steelyardBin
		steelyardBin = old
		f.start()
		steelyardBin = saved
	} else {
		f.start()
	}
	if err := f.agent.Stop(); err != nil {
		t.Errorf("agent exit on SIGTERM: %v", err)
	}
	table := func() string {
		out, err := f.sb.Node.Exec("nft", "list", "table", "ip", "steelyard")
		if err != nil {
			t.Fatalf("nft list table: %v\n%s", err, out)
		}
		return out
	}
	if os.Getenv("STEELYARD_OLD_BIN") == "" {
		old := legacyTable(t, table())
		path := filepath.Join(t.TempDir(), "old.nft")
		if err := os.WriteFile(path, []byte("delete table ip steelyard\n"+old), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := f.sb.Node.Exec("nft", "-f", path); err != nil {
			t.Fatalf("loading the old table: %v\n%s\n%s", err, out, old)
		}
	}
	before := table()
	if !strings.Contains(before, "map dm-") || !strings.Contains(before, ". meta l4proto map @dm-") {
		t.Fatalf("the old table has no concatenated weight map:\n%s", before)
	}
	shares := func(when string) {
		t.Helper()
		r, err := f.client.TCPConns(addrPort(webService.vip, 80), 4000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("web %s: %s", when, r)
		sandbox.ExpectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 2.5)
		r, err = f.client.TCPConns(addrPort(quadService.vip, 80), 4000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("quad %s: %s", when, r)
		sandbox.ExpectShares(t, r, map[string]float64{"quad-1": 10, "quad-2": 20, "quad-3": 30, "quad-4": 40}, 2.5)
	}
	shares("through the old table")

	// Connections throughout the restart, in bounded runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, failed := 0, map[string]int{}
	for _, s := range []svc{webService, quadService} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				select {
				case <-stop:
					return
				default:
				}
				r, err := f.client.TCPConns(addrPort(s.vip, 80), 200, sandbox.Load{Concurrency: 4})
				mu.Lock()
				if err != nil {
					failed[err.Error()]++
				}
				made += r.OK() + r.Failed()
				for k, n := range r.Errors {
					failed[s.name+": "+k] += n
				}
				mu.Unlock()
			}
		}()
	}
	f.start()
	// The old maps go once unused for StaleDelay (the agent syncs again
	// for that).
	sandbox.Poll(t, 15*time.Second, 100*time.Millisecond, "old weight maps deleted", func() (bool, string) {
		out := table()
		return !regexp.MustCompile(`map (dm|wm|nc|nl)-`).MatchString(out), out
	})
	time.Sleep(time.Second) // connections after the cleanup too
	close(stop)
	wg.Wait()
	if len(failed) > 0 || made == 0 {
		t.Errorf("connections during the upgrade: %d made, failed %v", made, failed)
	}
	t.Logf("%d connections during the upgrade, none failed", made)
	after := table()
	if !strings.Contains(after, "map dn-") || strings.Contains(after, "meta l4proto map @") || strings.Contains(after, "meta l4proto vmap @") {
		t.Errorf("the new table has no single-field weight map, or a rule still draws a concatenated key:\n%s", after)
	}
	if out, code := f.verify(); code != 0 {
		t.Errorf("verify after the upgrade: exit %d\n%s", code, out)
	}
	shares("after the upgrade")
}

// legacyTable rewrites an "nft list table" of this version's table into
// the old render's: weight maps "dm-"/"wm-"/"nc-"/"nl-" keyed
// "numgen random mod 1 . meta l4proto", each element's key "lo-hi .
// proto" (the protocol of the map's DNAT data; tcp for a verdict map, as
// the test's Services are TCP), and split rules drawing "numgen ... .
// meta l4proto". A test helper: nothing in steelyard reads nft text.
func legacyTable(t *testing.T, text string) string {
	t.Helper()
	oldName := map[string]string{"dn": "dm", "wv": "wm", "kc": "nc", "kl": "nl"}
	name := regexp.MustCompile(`(^|\s|@)(dn|wv|kc|kl)-`)
	var out []string
	inMap, proto := false, "tcp"
	elem := regexp.MustCompile(`(^\s*|[{,]\s*)(\d+(?:-\d+)?) : `)
	typeof := regexp.MustCompile(`typeof numgen random mod 1 : (.*)`)
	draw := regexp.MustCompile(`(numgen random mod \d+(?: offset \d+)?) (v?map) @(dn|wv|kc|kl)-`)
	for _, line := range strings.Split(text, "\n") {
		tl := strings.TrimSpace(line)
		switch {
		case regexp.MustCompile(`^map (dn|wv|kc|kl)-`).MatchString(tl):
			inMap, proto = true, "tcp"
		case strings.HasPrefix(tl, "map ") || strings.HasPrefix(tl, "set ") || strings.HasPrefix(tl, "chain "):
			inMap = false
		}
		if inMap {
			if m := typeof.FindStringSubmatch(tl); m != nil {
				for _, p := range []string{"tcp", "udp", "sctp"} {
					if strings.Contains(m[1], p+" dport") {
						proto = p
					}
				}
				line = strings.Replace(line, "typeof numgen random mod 1 :", "typeof numgen random mod 1 . meta l4proto :", 1)
			}
			line = elem.ReplaceAllString(line, "${1}${2} . "+proto+" : ")
		}
		line = draw.ReplaceAllString(line, "$1 . meta l4proto $2 @$3-")
		line = name.ReplaceAllStringFunc(line, func(s string) string {
			m := name.FindStringSubmatch(s)
			return m[1] + oldName[m[2]] + "-"
		})
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
