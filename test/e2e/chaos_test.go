//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Chaos faults for the iptables and nftables dataplanes; the measured
// recovery times are in docs/chaos.md.

// chaosMode is a dataplane and the ways an unrelated firewall reload wipes
// its rules.
type chaosMode struct {
	name   string
	args   []string
	faults []chaosFault
}

// chaosFault is one way of wiping the rules: commands run in the node
// namespace, with a file the commands name as {file} when file is set.
type chaosFault struct {
	name string
	cmds [][]string
	file string
	// survivor is a rule of that file that must still be in the kernel
	// after the repair: the agent writes only its own chains.
	survivor string
}

// unrelatedIptables is a firewall of another tool, as iptables-persistent
// or a shell script loads it: whole filter and nat tables, no --noflush, so
// every rule the agent wrote is gone.
const unrelatedIptables = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:site-input - [0:0]
-A INPUT -j site-input
-A site-input -p tcp --dport 22 -m comment --comment "site ssh" -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
COMMIT
`

// unrelatedNft is /etc/nftables.conf of another tool: it starts with
// flush ruleset, as Debian's does.
const unrelatedNft = `flush ruleset
table inet site {
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport 22 counter accept comment "site ssh"
	}
}
`

func chaosModes() []chaosMode {
	ipt := func(flavour string) []chaosFault {
		var flush [][]string
		for _, table := range []string{"filter", "nat"} {
			flush = append(flush, []string{"iptables-" + flavour, "-t", table, "-F"}, []string{"iptables-" + flavour, "-t", table, "-X"})
		}
		return []chaosFault{
			{name: "flush", cmds: flush},
			{name: "restore", cmds: [][]string{{"iptables-" + flavour + "-restore", "{file}"}}, file: unrelatedIptables, survivor: "site ssh"},
		}
	}
	return []chaosMode{
		{"iptables-nft", []string{"--mode", "iptables", "--iptables-mode", "nft"}, ipt("nft")},
		{"iptables-legacy", []string{"--mode", "iptables", "--iptables-mode", "legacy"}, ipt("legacy")},
		{"nftables", []string{"--mode", "nftables"}, []chaosFault{
			{name: "flush", cmds: [][]string{{"nft", "flush", "ruleset"}}},
			{name: "restore", cmds: [][]string{{"nft", "-f", "{file}"}}, file: unrelatedNft, survivor: "site ssh"},
		}},
	}
}

// chaosStart starts the agent of mode m (in a mount namespace of its own
// with a private /run, so its xtables lock is not the machine's) with
// --sync-period period and waits until verify passes.
func chaosStart(t *testing.T, f *fixture, m chaosMode, period time.Duration) *sandbox.Agent {
	t.Helper()
	args := append([]string{"-m", "--propagation", "private", "/bin/sh", "-c", `mount -t tmpfs -o size=1m tmpfs /run && exec "$@"`, "sh",
		steelyardBin, "run", "--manifests", f.dir, "--cluster-cidr", sandbox.ClusterCIDR.String(), "--sync-period", period.String(),
		"--metrics-bind-address", "", "--healthz-bind-address", ""}, m.args...)
	a, err := f.sb.StartAgent("/usr/bin/unshare", args...)
	if err != nil {
		t.Fatal(err)
	}
	f.agent = a
	if _, err := chaosWaitVerify(f, m, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return a
}

// chaosWaitVerify polls verify (in mode m) until it passes and returns how
// long that took.
func chaosWaitVerify(f *fixture, m chaosMode, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var out string
	for time.Since(start) < timeout {
		if exited, err := f.agent.Exited(); exited {
			return 0, &agentExit{err, f.agent.Log()}
		}
		stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin, "verify", "--manifests", f.dir}, m.args...)...)
		if err == nil {
			return time.Since(start), nil
		}
		out = stdout + stderr
		time.Sleep(50 * time.Millisecond)
	}
	return 0, &agentExit{nil, "verify still fails after " + timeout.String() + ":\n" + out}
}

type agentExit struct {
	err error
	log string
}

func (e *agentExit) Error() string {
	if e.err != nil {
		return "agent exited: " + e.err.Error() + "\n" + e.log
	}
	return e.log
}

// TestChaosFlush: an unrelated firewall reload wipes every rule, by
// flushing (iptables -F/-X of filter and nat, nft flush ruleset) or by
// loading a firewall of its own (iptables-restore of whole tables, nft -f of
// a file that starts with flush ruleset): the agent repairs it within one
// sync period (2 s) plus the sync itself, keeps the other tool's rules, and
// an established connection to a surviving endpoint keeps working.
func TestChaosFlush(t *testing.T) {
	const period = 2 * time.Second
	for _, m := range chaosModes() {
		for _, fault := range m.faults {
			t.Run(m.name+"/"+fault.name, func(t *testing.T) { chaosFlush(t, m, fault, period) })
		}
	}
}

func chaosFlush(t *testing.T, m chaosMode, fault chaosFault, period time.Duration) {
	f := newFixture(t, modeNamed(t, m.name))
	f.addPods(webService)
	f.write("web.yaml", webService)
	chaosStart(t, f, m, period)
	conn, err := f.client.Connect(addrPort(webService.vip, webService.port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	file := filepath.Join(t.TempDir(), "firewall")
	if err := os.WriteFile(file, []byte(fault.file), 0o644); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	for _, c := range fault.cmds {
		c = slices.Clone(c)
		for i := range c {
			c[i] = strings.ReplaceAll(c[i], "{file}", file)
		}
		if out, err := f.sb.Node.Exec(c...); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	if out, code := f.verify(); code == 0 {
		t.Fatalf("verify passes right after the %s: the fault did not wipe the rules\n%s", fault.name, out)
	}
	if _, err := chaosWaitVerify(f, m, 3*period); err != nil {
		t.Fatalf("not repaired: %v", err)
	}
	took := time.Since(flushed)
	t.Logf("%s: rules wiped by %s repaired after %s (sync period %s)", m.name, fault.name, took.Round(time.Millisecond), period)
	if took > period+time.Second {
		t.Errorf("repair took %s, more than one sync period (%s) plus 1 s", took.Round(time.Millisecond), period)
	}
	if fault.survivor != "" {
		dump := [][]string{{"iptables-" + strings.TrimPrefix(m.name, "iptables-") + "-save"}}
		if m.name == "nftables" {
			dump = [][]string{{"nft", "list", "ruleset"}}
		}
		out, err := f.sb.Node.Exec(dump[0]...)
		if err != nil || !strings.Contains(out, fault.survivor) {
			t.Errorf("the other tool's rule %q is gone after the repair (%v):\n%s", fault.survivor, err, out)
		}
	}
	if err := conn.Echo("after the "+fault.name, 2*time.Second); err != nil {
		t.Errorf("established connection broken by the %s and repair: %v", fault.name, err)
	}
	res, err := f.client.TCPConns(addrPort(webService.vip, webService.port), 50, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed() > 0 {
		t.Errorf("%d of 50 new connections failed after the repair: %v", res.Failed(), res.Errors)
	}
}

// TestChaosXtablesLock: another process holds the xtables lock for 10 s
// while a Service is added, in both iptables modes.
//
// iptables-legacy: the agent waits (iptables --wait 5, iptables-restore
// --wait 5), reports the wait (a warning or a failed sync naming the lock),
// does not spin (at most 5 failed syncs in 10 s), writes nothing without
// the lock, and programs the change soon after the lock is released.
//
// iptables-nft: the nf_tables flavour takes no lock (the kernel serialises
// its transactions), so the change is applied while the lock is held, with
// no failed sync: the agent does not wait for a lock nobody needs.
func TestChaosXtablesLock(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("flock (util-linux; scripts/install-deps.sh installs it) not installed: %v", err)
	}
	for _, m := range chaosModes()[:2] {
		t.Run(m.name, func(t *testing.T) { chaosXtablesLock(t, m) })
	}
}

func chaosXtablesLock(t *testing.T, m chaosMode) {
	const hold = 10 * time.Second
	f := newFixture(t, modeNamed(t, m.name))
	f.addPods(webService, quadService)
	f.write("web.yaml", webService)
	a := chaosStart(t, f, m, 30*time.Second)
	// The holder runs in the agent's mount namespace (its private /run)
	// and network namespace.
	holder := exec.Command("nsenter", "-t", strconv.Itoa(a.Pid()), "-m", "-n", "flock", "/run/xtables.lock", "sleep", strconv.Itoa(int(hold/time.Second)))
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	time.Sleep(200 * time.Millisecond) // the holder has the lock
	logBefore := len(a.Log())
	f.write("web.yaml", webService, quadService)
	held := time.Now()
	if m.name == "iptables-nft" {
		took, err := chaosWaitVerify(f, m, hold-2*time.Second)
		if err != nil {
			t.Fatalf("change not applied while another process holds the xtables lock (iptables-nft takes none): %v", err)
		}
		log := a.Log()[logBefore:]
		failed := strings.Count(log, `msg="sync failed"`)
		t.Logf("lock held; change applied %s after it was written, %d failed syncs", took.Round(time.Millisecond), failed)
		if failed > 0 || strings.Contains(log, "xtables lock") {
			t.Errorf("iptables-nft waited for or reported the xtables lock:\n%s", log)
		}
		return
	}
	// Near the end of the hold the change is not in the kernel: nothing
	// was written without the lock.
	time.Sleep(hold - 2*time.Second)
	if out, code := f.verify(); code == 0 {
		t.Errorf("verify passed while the lock was held: the change was applied without the lock?\n%s", out)
	}
	if err := holder.Wait(); err != nil {
		t.Fatalf("lock holder: %v", err)
	}
	released := time.Now()
	took, err := chaosWaitVerify(f, m, 20*time.Second)
	if err != nil {
		t.Fatalf("change not applied after the lock was released: %v", err)
	}
	log := a.Log()[logBefore:]
	failed := strings.Count(log, `msg="sync failed"`)
	t.Logf("lock held %s; %d failed syncs meanwhile; change applied %s after the release", released.Sub(held).Round(time.Millisecond), failed, took.Round(time.Millisecond))
	// The wait is reported: a failed sync, or the canary check's warning,
	// names the lock.
	if !strings.Contains(log, "xtables lock") {
		t.Errorf("the wait for the xtables lock was not reported:\n%s", log)
	}
	// iptables-restore waits 5 s per attempt and a retry follows 1 s
	// later: about 2 attempts in 10 s; more than 5 is an error loop.
	if failed > 5 {
		t.Errorf("%d failed syncs in %s: an error loop", failed, hold)
	}
}
