package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// perfProfile is `perf record` sampling one proxy's CPU (-perf-at): where
// its time goes during the endpoint changes (steelyard has no pprof
// endpoint). Sampling at 199 Hz without call graphs costs the proxy little.
type perfProfile struct {
	cmd  *exec.Cmd
	data string
	done chan error
}

// startPerf samples pid into dir/perf-NAME.data; nil when perf is missing
// or fails to start (logged: the run goes on without a profile).
func startPerf(dir, name string, pid int) *perfProfile {
	if dir == "" {
		return nil
	}
	bin, err := exec.LookPath("perf")
	if err != nil {
		logf("-perf-at: no perf: %v", err)
		return nil
	}
	data := filepath.Join(dir, "perf-"+name+".data")
	cmd := exec.Command(bin, "record", "-q", "-F", "199", "-p", strconv.Itoa(pid), "-o", data)
	if err := cmd.Start(); err != nil {
		logf("-perf-at: %v", err)
		return nil
	}
	p := &perfProfile{cmd: cmd, data: data, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	return p
}

// stop ends the sampling (SIGINT: perf writes its file) and writes the
// top of `perf report` (self time by symbol) beside the data.
func (p *perfProfile) stop(ctx context.Context) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(rctx, "perf", "report", "-i", p.data, "--stdio", "--no-children", "--sort", "dso,symbol", "--percent-limit", "0.5").Output()
	if err != nil {
		logf("-perf-at: perf report: %v", err)
		return
	}
	txt := p.data[:len(p.data)-len(".data")] + ".txt"
	if err := os.WriteFile(txt, out, 0o644); err != nil {
		logf("-perf-at: %v", err)
		return
	}
	logf("-perf-at: profile of the changes in %s", txt)
}
