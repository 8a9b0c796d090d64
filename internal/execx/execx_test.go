package execx

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// gone reports whether pid has exited (no process, or a zombie not yet
// reaped by its new parent).
func gone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] == "Z"
}

func waitGone(t *testing.T, pid int, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for !gone(pid) {
		if time.Since(start) > 5*time.Second {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("%s: child %d still running after 5 s", what, pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// TestMain doubles as the helper process of TestDeathOfParentKillsChild.
func TestMain(m *testing.M) {
	if os.Getenv("EXECX_HELPER") == "1" {
		cmd := Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString(strconv.Itoa(cmd.Process.Pid) + "\n")
		_ = cmd.Wait()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDeathOfParentKillsChild: a SIGKILLed parent leaves no child behind
// (Pdeathsig).
func TestDeathOfParentKillsChild(t *testing.T) {
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), "EXECX_HELPER=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		helper.Process.Kill()
		t.Fatalf("helper: %v", err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(line))
	helper.Process.Kill()
	_ = helper.Wait()
	t.Logf("child gone %s after its parent was killed", waitGone(t, child, "parent killed"))
}

// TestShutdown: Shutdown kills a running child at once, Run returns, and a
// command started afterwards fails. KillChildren finds a child that
// execx did not start.
func TestShutdown(t *testing.T) {
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := Command("sleep", "30")
	errc := make(chan error, 1)
	go func() { errc <- Run(cmd) }()
	for cmd.Process == nil {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	Shutdown()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Run returned nil for a killed child")
		}
		t.Logf("Run returned %v %s after Shutdown", err, time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5 s after Shutdown")
	}
	if err := Run(Command("true")); err == nil {
		t.Error("a command started after Shutdown ran")
	}
	if n := KillChildren(); n != 1 {
		t.Errorf("KillChildren signalled %d processes, want 1", n)
	}
	_ = other.Wait()
}
