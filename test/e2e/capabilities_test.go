//go:build e2e

package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// capMode is one dataplane under test.
type capMode struct {
	name string
	args []string
	// need are the capabilities the agent needs in this mode.
	need []string
}

func capModes() []capMode {
	return []capMode{
		{"iptables-nft", []string{"--mode", "iptables", "--iptables-mode", "nft"}, []string{"net_admin"}},
		{"iptables-legacy", []string{"--mode", "iptables", "--iptables-mode", "legacy"}, []string{"net_admin", "net_raw"}},
		{"nftables", []string{"--mode", "nftables"}, []string{"net_admin"}},
	}
}

// capRun starts the agent confined with caps and reports whether it works:
// verify (run unconfined, as the judge) passes within timeout while the
// agent runs. It returns the agent's log.
func capRun(t *testing.T, f *fixture, m capMode, caps []string, timeout time.Duration, extra ...string) (bool, string) {
	t.Helper()
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	args := append([]string{"-m", "--propagation", "private", "env", "CAPS=" + set, "/bin/sh", "-c", sandbox.Confine, "sh",
		steelyardBin, "run", "--manifests", f.dir, "--cluster-cidr", sandbox.ClusterCIDR.String(), "--sync-period", "2s"}, append(m.args, extra...)...)
	a, err := f.sb.StartAgent("/usr/bin/unshare", args...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	verifyArgs := append([]string{steelyardBin, "verify", "--manifests", f.dir}, m.args...)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if exited, _ := a.Exited(); exited {
			return false, a.Log()
		}
		if _, _, err := f.sb.Node.Exec2(verifyArgs...); err == nil {
			return true, a.Log()
		}
	}
	return false, a.Log()
}

// cleanupMode removes what an agent of mode m left, so the next run starts
// from an empty kernel.
func cleanupMode(t *testing.T, f *fixture, m capMode) {
	t.Helper()
	if out, err := f.sb.Node.Exec(append([]string{steelyardBin, "cleanup"}, m.args...)...); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
}

// lastError returns the last log line that reports a failure.
func lastError(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "level=error") || strings.Contains(lines[i], "level=fatal") || strings.HasPrefix(lines[i], "steelyard:") || strings.Contains(lines[i], "level=warn") {
			return lines[i]
		}
	}
	if len(lines) > 0 {
		return lines[len(lines)-1]
	}
	return ""
}

// TestCapabilities runs the agent of each dataplane as an unprivileged
// container would (read-only root and /proc/sys, a capability bounding
// set): it works with exactly the capabilities of its mode, and fails
// without any one of them. The net.ipv4.ip_forward sysctl is already 1
// (the CNI plugin, or the node, sets it); with it 0 and /proc/sys
// read-only, the agent refuses to start, and with --sysctl-dir on a
// writable bind of /proc/sys/net (the DaemonSet's way) it turns it on: the
// last two cases. test/node/privileges_test.go measures the same on the
// real node.
func TestCapabilities(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux; scripts/install-deps.sh installs it) not installed: %v", err)
	}
	for _, m := range capModes() {
		t.Run(m.name, func(t *testing.T) {
			f := newFixture(t, modeNamed(t, m.name))
			f.write("web.yaml", webService)
			if err := f.sb.Node.WriteSysctl("net/ipv4/ip_forward", "1"); err != nil {
				t.Fatal(err)
			}
			ok, log := capRun(t, f, m, m.need, 20*time.Second)
			if !ok {
				t.Fatalf("the agent does not work with %v, read-only root and /proc/sys:\n%s", m.need, log)
			}
			t.Logf("works with %v, read-only root filesystem and /proc/sys", m.need)
			for _, l := range strings.Split(log, "\n") {
				if strings.Contains(l, "level=warn") || strings.Contains(l, "level=error") {
					t.Logf("  agent: %s", l)
				}
			}
			cleanupMode(t, f, m)
			for i := range m.need {
				without := append(append([]string(nil), m.need[:i]...), m.need[i+1:]...)
				ok, log := capRun(t, f, m, without, 8*time.Second)
				if ok {
					t.Errorf("the agent works without %s (with %v): not needed", m.need[i], without)
				} else {
					t.Logf("without %s: fails: %s", m.need[i], lastError(log))
				}
				cleanupMode(t, f, m)
			}
			if err := f.sb.Node.WriteSysctl("net/ipv4/ip_forward", "0"); err != nil {
				t.Fatal(err)
			}
			ok, log = capRun(t, f, m, m.need, 5*time.Second)
			if ok {
				t.Errorf("the agent works with ip_forward 0 and /proc/sys read-only")
			} else {
				t.Logf("ip_forward 0, /proc/sys read-only: fails: %s", lastError(log))
			}
			// The DaemonSet's way: the host's /proc/sys/net mounted
			// writable elsewhere, --sysctl-dir pointing at it.
			ok, log = capRun(t, f, m, m.need, 20*time.Second, "--sysctl-dir", "/run/host/proc/sys")
			v, _ := f.sb.Node.ReadSysctl("net/ipv4/ip_forward")
			if !ok || v != "1" {
				t.Errorf("with --sysctl-dir on a writable /proc/sys/net: works %v, ip_forward %q:\n%s", ok, v, log)
			} else {
				t.Logf("ip_forward 0, --sysctl-dir /run/host/proc/sys (writable bind of /proc/sys/net): works, ip_forward now %s", v)
			}
			cleanupMode(t, f, m)
		})
	}
}
