// Package execx runs the kernel tools the agent drives (iptables-restore,
// iptables-save) as children that never outlive it.
//
// Two mechanisms, because either alone leaves a gap:
//   - every child gets Pdeathsig SIGKILL, so a SIGKILLed agent (a kubelet
//     giving up on it, an OOM kill) takes its children with it; without it
//     an iptables-nft-restore of 10,000 Services was measured running on
//     after its agent was killed and its network namespace deleted;
//   - every child runs under the process-wide shutdown context, so Shutdown
//     (called on SIGTERM) kills the children in flight at once and makes new
//     ones fail to start, and a sync in progress ends within milliseconds
//     instead of waiting for a restore that takes seconds.
//
// A killed iptables-restore commits nothing: each table is one atomic
// commit (COMMIT line), so the kernel keeps the last complete state.
package execx

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var shutdownCtx, shutdown = context.WithCancel(context.Background())

// waitDelay bounds how long Wait waits for a killed child's pipes to close.
const waitDelay = time.Second

// Context is done once Shutdown was called. Code that runs children through
// another library (knftables takes a context per call) should derive its
// contexts from it.
func Context() context.Context { return shutdownCtx }

// Shutdown kills every child started by Command that is still running and
// makes later ones fail to start. It is safe to call more than once.
func Shutdown() { shutdown() }

// Command returns a command that is killed (SIGKILL) on Shutdown and when the
// agent dies. Run it with Run, not with its own Run method.
func Command(name string, args ...string) *exec.Cmd {
	return CommandContext(shutdownCtx, name, args...)
}

// CommandContext is Command with a context of the caller's, which must be
// derived from Context (so that Shutdown still ends the child).
func CommandContext(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	return cmd
}

// Run runs cmd to completion. The goroutine stays on its OS thread for the
// child's lifetime: Pdeathsig fires when the parent *thread* exits, and the
// Go runtime ends a thread when a goroutine that locked it returns, so
// another goroutine must not be able to end ours under a running child
// (golang/go#27505).
func Run(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return cmd.Run()
}

// KillChildren sends SIGKILL to every remaining child process of this
// process (also those started by libraries whose commands we do not build,
// such as go-iptables' single-rule calls), found by their parent PID in
// /proc, and returns how many it signalled. Call it last on shutdown.
func KillChildren() int {
	self := os.Getpid()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if ppid, ok := parentPID(pid); ok && ppid == self {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// parentPID reads the 4th field of /proc/<pid>/stat; the 2nd (the command
// name in parentheses) may hold spaces, so fields start after the last ")".
func parentPID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}
