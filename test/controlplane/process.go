package controlplane

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is etcd or kube-apiserver, with its output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
	err     error // Wait's result, valid once exited is closed
}

// startProcess starts bin with args, appending its standard output and
// error to logPath.
func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child has its own descriptor
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f // *os.File: no copying goroutines
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Out of the terminal's process group, so Ctrl-C reaches only the
		// test binary, which stops kube-apiserver before etcd.
		Setpgid: true,
		// Die with the test binary even when it cannot clean up (killed,
		// `go test -timeout` expired).
		Pdeathsig: syscall.SIGKILL,
	}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the process has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// exitError describes how the process ended; call it once exited is closed.
func (p *process) exitError() error {
	if p.err == nil {
		return fmt.Errorf("%s exited with status 0", p.name)
	}
	return fmt.Errorf("%s exited: %w", p.name, p.err)
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs the process group.
// It returns when the process is gone.
func (p *process) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// tail returns the last n lines of the log.
func (p *process) tail(n int) string {
	return tailFile(p.logPath, n)
}

func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// spawn starts cmd from one OS thread that is locked for the life of the
// test binary.
//
// Why: Pdeathsig fires when the *thread* that forked the child exits, not
// the process. Go threads normally live forever, but a goroutine that locks
// its thread and ends without unlocking it (what network-namespace code
// does with a thread it cannot switch back) takes the thread with it, and
// would SIGKILL any control plane process that thread happened to fork.
// The spawner thread is locked before anything can move it to another
// namespace and never exits, so the signal only comes when the test binary
// dies.
func spawn(cmd *exec.Cmd) error {
	spawner.once.Do(func() {
		spawner.reqs = make(chan spawnRequest)
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: this thread is the spawner's
			close(ready)
			for r := range spawner.reqs {
				r.done <- r.cmd.Start()
			}
		}()
		<-ready
	})
	done := make(chan error, 1)
	spawner.reqs <- spawnRequest{cmd: cmd, done: done}
	return <-done
}

var spawner struct {
	once sync.Once
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}
