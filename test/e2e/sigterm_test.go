//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// manyServices returns n Services of two endpoints each; gen changes every
// endpoint's target port, so going from one generation to the next rewrites
// every endpoint chain (a long restore).
func manyServices(n, gen int) []svc {
	out := make([]svc, n)
	for i := range out {
		out[i] = svc{
			name: fmt.Sprintf("s%05d", i), vip: fmt.Sprintf("198.18.%d.%d", 1+i/250, 1+i%250),
			port: 80, targetPort: int32(8080 + gen),
			endpoints: []pod{
				{fmt.Sprintf("s%05d-a", i), fmt.Sprintf("198.19.%d.%d", 1+i/250, 1+i%250)},
				{fmt.Sprintf("s%05d-b", i), fmt.Sprintf("198.19.%d.%d", 101+i/250, 1+i%250)},
			},
		}
	}
	return out
}

// envInt reads a positive integer from the environment, else def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// childNamed returns the PID of a child of parent whose command line starts
// with a program named name, or 0.
func childNamed(parent int, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(parent) {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if argv0, _, _ := strings.Cut(string(cmd), "\x00"); filepath.Base(argv0) == name {
			return pid
		}
	}
	return 0
}

// TestSigtermMidSync: SIGTERM while the kernel tool applies a big change
// (SIGTERM_SERVICES Services, 5,000 by default, every endpoint chain
// rewritten), in each dataplane that execs one: the agent exits within
// 2 s, no process is left in the node's network namespace, and the kernel
// holds one complete state, the old or the new (verify passes against one
// of the two manifest sets).
func TestSigtermMidSync(t *testing.T) {
	for _, m := range []struct {
		name, child string
		args        []string
	}{
		{"iptables-nft", "iptables-nft-restore", []string{"--mode", "iptables", "--iptables-mode", "nft"}},
		{"iptables-legacy", "iptables-legacy-restore", []string{"--mode", "iptables", "--iptables-mode", "legacy"}},
		{"nftables", "nft", []string{"--mode", "nftables"}},
	} {
		t.Run(m.name, func(t *testing.T) { signalMidSync(t, m.child, m.args, syscall.SIGTERM) })
	}
	// SIGKILL of the agent while iptables-nft-restore runs (a kubelet
	// giving up on it, an OOM kill): no process is left in the node's
	// namespace (the restore dies with it: Pdeathsig) and the kernel holds
	// one complete state.
	t.Run("sigkill-iptables-nft", func(t *testing.T) {
		signalMidSync(t, "iptables-nft-restore", []string{"--mode", "iptables", "--iptables-mode", "nft"}, syscall.SIGKILL)
	})
}

// inputWritten reports whether parent no longer holds the pipe that is
// child's standard input: the whole ruleset was written and the child is
// working on it (without Pdeathsig, a child in that phase outlives a killed
// agent; before it, it reads EOF and gives up).
func inputWritten(parent, child int) bool {
	stdin, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", child))
	if err != nil || !strings.HasPrefix(stdin, "pipe:") {
		return false
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", parent))
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", parent, fd.Name())); l == stdin {
			return false
		}
	}
	return true
}

// signalMidSync sends sig to the agent while its child applies a big change
// and checks the exit, the node namespace and the kernel state.
func signalMidSync(t *testing.T, child string, modeArgs []string, sig syscall.Signal) {
	n := envInt("SIGTERM_SERVICES", 5000)
	f := newFixture(t, modeWithArgs(t, modeArgs))
	f.noClusterCIDR = true
	oldDir, newDir := t.TempDir(), t.TempDir()
	write := func(dir string, gen int) {
		saved := f.dir
		f.dir = dir
		f.write("many.yaml", manyServices(n, gen)...)
		f.dir = saved
	}
	write(oldDir, 0)
	write(newDir, 1)
	write(f.dir, 0)
	a, err := f.sb.StartAgent(steelyardBin, append([]string{"run", "--manifests", f.dir, "--metrics-bind-address", "", "--healthz-bind-address", ""}, modeArgs...)...)
	if err != nil {
		t.Fatal(err)
	}
	f.agent = a
	start := time.Now()
	for !agentSynced(a.Log()) {
		if exited, err := a.Exited(); exited {
			t.Fatalf("agent exited: %v\n%s", err, a.Log())
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatal("no first sync after 3 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("first sync of %d Services done %s after start", n, time.Since(start).Round(time.Millisecond))
	nodeNS, err := sandbox.NetnsOf(fmt.Sprintf("/proc/%d/ns/net", a.Pid()))
	if err != nil {
		t.Fatal(err)
	}

	write(f.dir, 1)
	changed := time.Now()
	restore := 0
	for restore == 0 {
		if time.Since(changed) > time.Minute {
			t.Fatalf("no %s child within a minute of the change\n%s", child, a.Log())
		}
		restore = childNamed(a.Pid(), child)
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("%s (pid %d) running %s after the change", child, restore, time.Since(changed).Round(time.Millisecond))
	if sig == syscall.SIGKILL {
		// Once the agent has written all of it: the phase in which a
		// child without Pdeathsig outlives its agent.
		for !inputWritten(a.Pid(), restore) && childNamed(a.Pid(), child) == restore {
			time.Sleep(time.Millisecond)
		}
		t.Logf("%s has all its input %s after the change", child, time.Since(changed).Round(time.Millisecond))
	} else {
		// Into the restore, so that the kernel is being written.
		time.Sleep(100 * time.Millisecond)
	}
	if childNamed(a.Pid(), child) != restore {
		t.Log("the restore ended within 100 ms: the signal lands after it (use a larger SIGTERM_SERVICES for a mid-restore signal)")
	}
	sent := time.Now()
	if err := syscall.Kill(a.Pid(), sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(15 * time.Second):
		syscall.Kill(a.Pid(), syscall.SIGKILL)
		<-a.Done()
		t.Errorf("agent still running 15 s after %v; killed", sig)
	}
	took := time.Since(sent)
	t.Logf("agent exited %s after %v", took.Round(time.Millisecond), sig)
	if took > 2*time.Second {
		t.Errorf("agent took %s to exit after %v, want at most 2 s", took.Round(time.Millisecond), sig)
	}
	var left []string
	for deadline := time.Now().Add(500 * time.Millisecond); ; time.Sleep(20 * time.Millisecond) {
		if left, _ = sandbox.ProcessesIn(nodeNS); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("processes left in the node namespace after the agent exited:\n%s", strings.Join(left, "\n"))
		for _, p := range left {
			pid, _ := strconv.Atoi(strings.Fields(p)[0])
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}

	// The kernel holds one complete state.
	verifyDir := func(dir string) (string, int) {
		stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin, "verify", "--manifests", dir}, modeArgs...)...)
		return stdout + stderr, sandbox.ExitCode(err)
	}
	outOld, codeOld := verifyDir(oldDir)
	outNew, codeNew := verifyDir(newDir)
	switch {
	case codeOld == 0:
		t.Log("the kernel holds the old state (the restore was killed before its commit)")
	case codeNew == 0:
		t.Log("the kernel holds the new state (the restore committed before the signal)")
	default:
		t.Errorf("the kernel holds neither state: verify old exit %d, new exit %d\n%.2000s\n%.2000s", codeOld, codeNew, outOld, outNew)
	}
	if log := a.Log(); strings.Contains(log, "sync still running at shutdown") {
		t.Log("the agent logged: sync still running at shutdown")
	}
}
