//go:build ipvsvm

package ipvs

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestIPVSCapabilities: the IPVS dataplane works with the DaemonSet's set
// (NET_ADMIN, NET_RAW: this VM's iptables is legacy) and --sysctl-dir on
// the /proc/sys/net mount, and fails without each of the three. The ip_vs
// modules are loaded by the VM's init, so module loading is not measured.
func TestIPVSCapabilities(t *testing.T) {
	if steelyardBin == "" || examplesDir == "" {
		t.Skip("runs inside the IPVS VM (scripts/vm/test-ipvs.sh); STEELYARD_BIN and STEELYARD_EXAMPLES unset")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Fatal(err)
	}
	// util-linux's (busybox's applet has no --bounding-set, and busybox sh
	// prefers its applets: hence the full path in confine).
	if _, err := exec.LookPath("/usr/bin/setpriv"); err != nil {
		t.Fatalf("util-linux setpriv is not in the VM (scripts/vm/run.sh copies it): %v", err)
	}
	// errorWith returns the first log line with every one of want, or "".
	errorWith := func(log string, want ...string) string {
		for _, l := range strings.Split(log, "\n") {
			all := true
			for _, w := range want {
				all = all && strings.Contains(l, w)
			}
			if all {
				return l
			}
		}
		return ""
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	dir := t.TempDir()
	copyDir(t, examplesDir, dir)
	t.Setenv("NODE_NAME", thisNode)
	svcs, slices, errs := controller.NewManifestSource(dir).Load()
	if len(errs) > 0 {
		t.Fatalf("examples: %v", errs)
	}
	st, _ := controller.NewBuilder().Build(svcs, slices)
	for _, sp := range st.Services {
		for _, b := range sp.Backends {
			if sb.Pod(b.Name) == nil {
				if _, err := sb.AddPod(b.Name, b.IP, b.Port); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// run starts the confined agent and reports whether verify (run
	// unconfined, the judge) passes within timeout, or stops as soon as
	// the agent logs a line with want (the failure expected without a
	// capability; under TCG on a busy machine a first sync can take a
	// minute, so a plain timeout would prove nothing). It cleans up after.
	run := func(caps []string, timeout time.Duration, want []string, extra ...string) (bool, string) {
		t.Helper()
		set := "-all"
		for _, c := range caps {
			set += ",+" + c
		}
		args := append([]string{"-m", "--propagation", "private", "env", "CAPS=" + set, "/bin/sh", "-c", sandbox.Confine, "sh",
			steelyardBin, "run", "--manifests", dir, "--mode", "ipvs", "--cluster-cidr", sandbox.ClusterCIDR.String(),
			"--sync-period", "2s", "--metrics-bind-address", "", "--healthz-bind-address", ""}, extra...)
		a, err := sb.StartAgent(unshare, args...)
		if err != nil {
			t.Fatal(err)
		}
		ok := false
		for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if exited, _ := a.Exited(); exited {
				break
			}
			if len(want) > 0 && errorWith(a.Log(), want...) != "" {
				break
			}
			if _, _, err := sb.Node.Exec2(steelyardBin, "verify", "--manifests", dir, "--mode", "ipvs"); err == nil {
				ok = true
				break
			}
		}
		_ = a.Stop()
		// Not fatal: cleanup of a node where the agent created nothing
		// fails today (iptables-legacy -C of a jump to a missing chain
		// exits 2, "Couldn't load target"); verify judges the next run.
		if out, err := sb.Node.Exec(steelyardBin, "cleanup", "--mode", "ipvs"); err != nil {
			t.Logf("cleanup: %v (%d bytes of output)", err, len(out))
		}
		return ok, a.Log()
	}
	sysctlDir := []string{"--sysctl-dir", "/run/host/proc/sys"}
	need := []string{"net_admin", "net_raw"}
	resetVS := func() {
		t.Helper()
		if err := sb.Node.WriteSysctl("net/ipv4/vs/conntrack", "0"); err != nil {
			t.Fatal(err)
		}
	}

	resetVS()
	t0 := time.Now()
	ok, log := run(need, 120*time.Second, nil, sysctlDir...)
	if !ok {
		t.Fatalf("the IPVS agent does not work with %v and --sysctl-dir:\n%s", need, log)
	}
	v, _ := sb.Node.ReadSysctl("net/ipv4/vs/conntrack")
	t.Logf("works with %v, read-only root and /proc/sys, --sysctl-dir on /proc/sys/net: verify passes in %v; net.ipv4.vs.conntrack now %s", need, time.Since(t0).Round(time.Millisecond), v)
	// The error each removal gives (the first write that needs it).
	wants := map[string][]string{
		"net_admin": {"sync failed", "operation not permitted"},
		"net_raw":   {"sync failed", "iptables-legacy-restore", "unable to initialize table"},
	}
	for i := range need {
		without := append(append([]string(nil), need[:i]...), need[i+1:]...)
		ok, log := run(without, 120*time.Second, wants[need[i]], sysctlDir...)
		if line := errorWith(log, wants[need[i]]...); ok || line == "" {
			t.Errorf("without %s: verify passed %v, no log line with %q:\n%s", need[i], ok, wants[need[i]], log)
		} else {
			t.Logf("without %s: fails: %s", need[i], line)
		}
	}
	resetVS()
	ro := []string{"sync failed", "net.ipv4.vs.conntrack", "read-only file system"}
	ok, log = run(need, 120*time.Second, ro)
	if line := errorWith(log, ro...); ok || line == "" {
		t.Errorf("without --sysctl-dir (net.ipv4.vs.conntrack 0, /proc/sys read-only): verify passed %v, no log line with %q:\n%s", ok, ro, log)
	} else {
		t.Logf("without --sysctl-dir (net.ipv4.vs.conntrack 0): fails: %s", line)
	}
}
