package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// netnsDir is where `ip netns add` mounts named namespaces.
const netnsDir = "/run/netns"

// ExecTimeout bounds every command run by NS.Exec.
var ExecTimeout = 2 * time.Minute

// NS is one named network namespace of a sandbox: the node, a client or a pod.
type NS struct {
	// Name is the namespace name, as `ip netns list` shows it.
	Name string
	// Addr is the client's or pod's address (invalid for the node).
	Addr netip.Addr

	path   string
	handle ns.NetNS

	// nextUDPPort hands out source ports for UDPFlows; see there.
	nextUDPPort atomic.Uint32

	mu    sync.Mutex
	conns map[*Conn]bool
}

func createNS(name string) (*NS, error) {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %w: %s", name, err, bytes.TrimSpace(out))
	}
	n := &NS{Name: name, path: filepath.Join(netnsDir, name), conns: map[*Conn]bool{}}
	h, err := ns.GetNS(n.path)
	if err != nil {
		n.delete()
		return nil, fmt.Errorf("open namespace %s: %w", name, err)
	}
	n.handle = h
	if err := n.ip("link", "set", "lo", "up"); err != nil {
		n.delete()
		return nil, err
	}
	return n, nil
}

// delete closes what the sandbox holds open in the namespace and removes it.
func (n *NS) delete() error {
	n.mu.Lock()
	conns := n.conns
	n.conns = nil
	n.mu.Unlock()
	for c := range conns {
		c.conn.Close()
	}
	if n.handle != nil {
		n.handle.Close()
		n.handle = nil
	}
	out, err := exec.Command("ip", "netns", "delete", n.Name).CombinedOutput()
	if err != nil {
		if _, statErr := os.Stat(n.path); errors.Is(statErr, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("ip netns delete %s: %w: %s", n.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Do runs f on a thread that is inside the namespace. Sockets f creates
// belong to the namespace for their whole life and may be used from any
// goroutine afterwards. Goroutines that f starts do NOT run in the namespace.
func (n *NS) Do(f func() error) error {
	if n.handle == nil {
		return fmt.Errorf("namespace %s is closed", n.Name)
	}
	return n.handle.Do(func(ns.NetNS) error { return f() })
}

// ExecError is the error of a command that ran and failed.
type ExecError struct {
	NS       string
	Argv     []string
	ExitCode int // -1 when killed by a signal or the timeout
	Stdout   string
	Stderr   string
	Err      error
}

func (e *ExecError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		msg = strings.TrimSpace(e.Stdout)
	}
	return fmt.Sprintf("[%s] %s: %v: %s", e.NS, strings.Join(e.Argv, " "), e.Err, msg)
}

func (e *ExecError) Unwrap() error { return e.Err }

// ExitCode returns the exit code carried by err: 0 for nil, the command's
// code for an *ExecError, -1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExecError
	if errors.As(err, &ee) {
		return ee.ExitCode
	}
	return -1
}

// Exec runs argv inside the namespace (`ip netns exec <name> argv...`),
// bounded by ExecTimeout, and returns its standard output. A non-zero exit
// returns an *ExecError holding both outputs and the exit code.
func (n *NS) Exec(argv ...string) (string, error) {
	stdout, _, err := n.Exec2(argv...)
	return stdout, err
}

// Exec2 is Exec returning standard error as well.
func (n *NS) Exec2(argv ...string) (stdout, stderr string, err error) {
	if len(argv) == 0 {
		return "", "", errors.New("exec: empty command")
	}
	ctx, cancel := context.WithTimeout(context.Background(), ExecTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	runErr := cmd.Run()
	if runErr != nil {
		code := -1
		var xe *exec.ExitError
		if errors.As(runErr, &xe) {
			code = xe.ExitCode()
		}
		if ctx.Err() != nil {
			runErr = fmt.Errorf("timed out after %s: %w", ExecTimeout, runErr)
		}
		return o.String(), e.String(), &ExecError{NS: n.Name, Argv: argv, ExitCode: code, Stdout: o.String(), Stderr: e.String(), Err: runErr}
	}
	return o.String(), e.String(), nil
}

// ip runs `ip -n <name> args...`: every interface, address and route change
// of the sandbox goes through here or ipBatch, so none reaches the root
// namespace.
func (n *NS) ip(args ...string) error {
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("[%s] ip %s: %w: %s", n.Name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// ipBatch runs several ip commands in one `ip -n <name> -batch -` call.
func (n *NS) ipBatch(lines ...string) error {
	cmd := exec.Command("ip", "-n", n.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("[%s] ip -batch:\n  %s\n%w: %s", n.Name, strings.Join(lines, "\n  "), err, bytes.TrimSpace(out))
	}
	return nil
}

// WriteSysctl sets a sysctl of this namespace, key as a path below
// /proc/sys ("net/ipv4/ip_forward"). Only net/ keys are namespaced; others
// are refused so the host is never changed.
func (n *NS) WriteSysctl(key, value string) error {
	if !strings.HasPrefix(key, "net/") || strings.Contains(key, "..") {
		return fmt.Errorf("sysctl %s: only net/ keys are per namespace", key)
	}
	return n.Do(func() error {
		// /proc/sys/net resolves to the namespace of the opening thread.
		return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
	})
}

// ReadSysctl reads a sysctl of this namespace (see WriteSysctl).
func (n *NS) ReadSysctl(key string) (string, error) {
	var v []byte
	err := n.Do(func() error {
		var err error
		v, err = os.ReadFile(filepath.Join("/proc/sys", key))
		return err
	})
	return strings.TrimSpace(string(v)), err
}
