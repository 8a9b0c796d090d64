package controlplane

import (
	"path/filepath"
	"time"
)

// Component is one more long-running process of a test cluster
// (kube-controller-manager, kube-scheduler, containerd, kubelet), run the
// way etcd and kube-apiserver are: output appended to its own log file, its
// own process group (Ctrl-C reaches only the test binary), and SIGKILLed
// when the test binary dies (see spawn).
type Component struct {
	p *process
}

// StartComponent starts bin with args, its output appended to logPath.
func StartComponent(name, bin string, args []string, logPath string) (*Component, error) {
	p, err := startProcess(name, bin, args, logPath)
	if err != nil {
		return nil, err
	}
	return &Component{p: p}, nil
}

// Pid is the process's ID.
func (c *Component) Pid() int { return c.p.cmd.Process.Pid }

// Running reports whether the process has not exited yet.
func (c *Component) Running() bool { return c.p.running() }

// Exited is closed when the process has exited.
func (c *Component) Exited() <-chan struct{} { return c.p.exited }

// ExitError describes how the process ended; valid once Exited is closed.
func (c *Component) ExitError() error { return c.p.exitError() }

// Stop sends SIGTERM, waits up to grace, then SIGKILLs the process group.
func (c *Component) Stop(grace time.Duration) { c.p.stop(grace) }

// Tail returns the last n lines of the log.
func (c *Component) Tail(n int) string { return c.p.tail(n) }

// LogPath is the log file.
func (c *Component) LogPath() string { return c.p.logPath }

// ServiceAccountKeyFile is the RSA key kube-apiserver signs and verifies
// ServiceAccount tokens with; kube-controller-manager's
// --service-account-private-key-file.
func (cp *ControlPlane) ServiceAccountKeyFile() string {
	return filepath.Join(cp.Dir, "service-account.key")
}
