package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
)

var nlog = logrus.WithField("subsys", "nginx")

// NginxMetrics are the supervisor's Prometheus metrics.
type NginxMetrics struct {
	Reloads        prometheus.Counter
	ReloadFailures prometheus.Counter
	LastReload     prometheus.Gauge
	ConfigHash     prometheus.Gauge
	Restarts       prometheus.Counter
}

// NewNginxMetrics creates the metrics and registers them in reg (if not nil).
func NewNginxMetrics(reg prometheus.Registerer) *NginxMetrics {
	m := &NginxMetrics{
		Reloads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "steelyard", Subsystem: "ingress",
			Name: "nginx_reloads_total", Help: "nginx configuration reloads (a new nginx.conf swapped in and nginx signalled)."}),
		ReloadFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "steelyard", Subsystem: "ingress",
			Name: "nginx_reload_failures_total", Help: "Rendered configurations that failed nginx -t or could not be swapped in (nginx kept the previous one)."}),
		LastReload: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "steelyard", Subsystem: "ingress",
			Name: "nginx_last_reload_timestamp_seconds", Help: "Unix time of the last successful reload (or first start)."}),
		ConfigHash: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "steelyard", Subsystem: "ingress",
			Name: "nginx_config_hash", Help: "The first 48 bits of the SHA-256 of the running nginx.conf."}),
		Restarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "steelyard", Subsystem: "ingress",
			Name: "nginx_restarts_total", Help: "Times nginx exited unexpectedly and was started again."}),
	}
	if reg != nil {
		reg.MustRegister(m.Reloads, m.ReloadFailures, m.LastReload, m.ConfigHash, m.Restarts)
	}
	return m
}

// Nginx runs nginx as a child process and swaps configurations into it.
//
// Apply writes a new config to a temporary file, checks it with `nginx -t`,
// renames it over nginx.conf (atomic on one filesystem) and sends SIGHUP;
// when the text is the one running, it does nothing. Run keeps nginx alive:
// if it dies, it is started again with the current config.
type Nginx struct {
	// Binary is the nginx executable; Dir its working directory (nginx.conf,
	// certs/, temporary files, pid file).
	Binary, Dir string
	Metrics     *NginxMetrics

	mu      sync.Mutex
	current string // text of the running nginx.conf ("" before the first)
	proc    *os.Process
	started chan struct{} // closed when nginx first runs
	once    sync.Once
	done    chan struct{} // closed when Run has returned (nginx stopped)
	// wrap prefixes the nginx -t command and testArgs follow the binary:
	// unit tests run it in a private network namespace ("unshare -n"),
	// since nginx -t binds the ports.
	wrap, testArgs []string
}

// NewNginx prepares dir (0755, certs/ 0700) for nginx.
func NewNginx(binary, dir string, m *NginxMetrics) (*Nginx, error) {
	if m == nil {
		m = NewNginxMetrics(nil)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(abs, "certs"), 0o700); err != nil {
		return nil, fmt.Errorf("nginx dir: %w", err)
	}
	// Workers (user nobody) only need to reach their temporary folders.
	if err := os.Chmod(abs, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(abs, "certs"), 0o700); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath(binary); err != nil {
		return nil, fmt.Errorf("--nginx %q: %w", binary, err)
	}
	n := &Nginx{Binary: binary, Dir: abs, Metrics: m, started: make(chan struct{}), done: make(chan struct{})}
	// A previous agent killed without cleaning up may have left nginx
	// workers holding the ports.
	n.killLeftovers()
	return n, nil
}

// ConfPath is the running configuration file.
func (n *Nginx) ConfPath() string { return filepath.Join(n.Dir, "nginx.conf") }

// Apply makes out the running configuration. It returns whether nginx was
// reloaded. On error nginx keeps its previous configuration.
func (n *Nginx) Apply(out Output) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if out.Text == n.current {
		return false, nil
	}
	if err := n.swap(out); err != nil {
		n.Metrics.ReloadFailures.Inc()
		return false, err
	}
	first := n.current == ""
	n.current = out.Text
	n.Metrics.ConfigHash.Set(hash48(out.Text))
	n.Metrics.LastReload.SetToCurrentTime()
	n.removeStaleCerts(out.Certs)
	if first || n.proc == nil {
		// Run starts nginx with this config.
		n.once.Do(func() { close(n.started) })
		return false, nil
	}
	if err := n.proc.Signal(syscall.SIGHUP); err != nil {
		n.Metrics.ReloadFailures.Inc()
		return false, fmt.Errorf("signal nginx to reload: %w", err)
	}
	n.Metrics.Reloads.Inc()
	nlog.WithField("hash", out.Hash()[:12]).Info("nginx reloaded")
	return true, nil
}

// swap writes the certificates and a temporary config, tests it and
// renames it over nginx.conf.
func (n *Nginx) swap(out Output) error {
	for name, b := range out.Certs {
		p := filepath.Join(n.Dir, "certs", name)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, b) {
			continue
		}
		if err := writeFileAtomic(p, b, 0o600); err != nil {
			return fmt.Errorf("certificate %s: %w", name, err)
		}
	}
	tmp, err := os.CreateTemp(n.Dir, "nginx.conf.new-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(out.Text); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := n.test(tmp.Name()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), n.ConfPath()); err != nil {
		return fmt.Errorf("swap nginx.conf: %w", err)
	}
	return nil
}

// test runs `nginx -t` on a config file. It runs in nginx's network
// namespace: nginx -t binds the listening ports (tolerating "in use", so the
// running nginx does not make it fail).
func (n *Nginx) test(conf string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append(append(append(append([]string(nil), n.wrap...), n.Binary), n.testArgs...), "-t", "-q", "-p", n.Dir+"/", "-e", "stderr", "-c", conf)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nginx -t rejected the new config (kept the running one): %w: %s", err, strings.TrimSpace(string(b)))
	}
	return nil
}

// removeStaleCerts deletes certificate files the running config no longer uses.
func (n *Nginx) removeStaleCerts(keep map[string][]byte) {
	entries, err := os.ReadDir(filepath.Join(n.Dir, "certs"))
	if err != nil {
		return
	}
	for _, e := range entries {
		if _, ok := keep[e.Name()]; !ok {
			_ = os.Remove(filepath.Join(n.Dir, "certs", e.Name()))
		}
	}
}

// Run starts nginx once Apply has written the first config, restarts it
// whenever it exits, and stops it (graceful SIGQUIT, then SIGKILL) when ctx
// is done.
func (n *Nginx) Run(ctx context.Context) {
	defer close(n.done)
	select {
	case <-n.started:
	case <-ctx.Done():
		return
	}
	backoff := time.Second
	for {
		start := time.Now()
		err := n.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		n.Metrics.Restarts.Inc()
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		nlog.WithError(err).WithField("restart-in", backoff).Warn("nginx exited; starting it again")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// runOnce runs nginx until it exits or ctx is done. The goroutine keeps
// its OS thread for nginx's whole life: Pdeathsig is tied to the thread
// that started the child, and it makes the kernel stop nginx if the agent
// dies without cleaning up (so the next agent can bind the ports).
func (n *Nginx) runOnce(ctx context.Context) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(n.Binary, "-p", n.Dir+"/", "-e", "stderr", "-c", n.ConfPath())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// A plain pipe rather than StderrPipe: workers that outlive a killed
	// master keep its write end open, and Wait must not wait for them.
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stderr = pw
	n.mu.Lock()
	err = cmd.Start()
	pw.Close()
	if err != nil {
		n.mu.Unlock()
		pr.Close()
		return fmt.Errorf("start nginx: %w", err)
	}
	n.proc = cmd.Process
	n.mu.Unlock()
	nlog.WithField("pid", cmd.Process.Pid).Info("nginx started")
	go func() {
		defer pr.Close()
		copyLog(pr)
	}()
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	select {
	case err := <-waitDone:
		n.mu.Lock()
		n.proc = nil
		n.mu.Unlock()
		// Workers outlive a killed master and keep the ports: end the
		// whole process group before starting again.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if err == nil {
			err = errors.New("exited with status 0")
		}
		return err
	case <-ctx.Done():
		// Graceful (finish requests in flight) for a few seconds, well
		// within a DaemonSet's or the tests' stop timeout, then kill.
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-waitDone:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-waitDone
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		n.mu.Lock()
		n.proc = nil
		n.mu.Unlock()
		nlog.Info("nginx stopped")
		return ctx.Err()
	}
}

// copyLog sends nginx's error log lines to logrus.
func copyLog(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "[emerg]"), strings.Contains(line, "[alert]"), strings.Contains(line, "[crit]"), strings.Contains(line, "[error]"):
			nlog.Error(line)
		case strings.Contains(line, "[warn]"):
			nlog.Warn(line)
		default:
			nlog.Debug(line)
		}
	}
}

// hash48 turns a text's SHA-256 into a number a float64 gauge holds exactly.
func hash48(s string) float64 {
	h := sha256.Sum256([]byte(s))
	return float64(binary.BigEndian.Uint64(h[:8]) >> 16)
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Done is closed when Run has returned and nginx has stopped.
func (n *Nginx) Done() <-chan struct{} { return n.done }

// killLeftovers kills the nginx processes of the process group named in
// Dir/nginx.pid (nginx runs in its own group, led by the master), when the
// master is gone: workers outlive a master killed with SIGKILL, for
// instance when the agent itself was killed. Only processes whose command
// is nginx are touched.
func (n *Nginx) killLeftovers() {
	b, err := os.ReadFile(filepath.Join(n.Dir, "nginx.pid"))
	if err != nil {
		return
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pgid <= 1 {
		return
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		stat, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if s[open+1:end] != "nginx" || len(f) < 3 || f[2] != strconv.Itoa(pgid) || f[0] == "Z" {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(s[:open])); err == nil && pid > 1 {
			nlog.WithField("pid", pid).Warn("killing an nginx process left by a previous run")
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
