package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Helpers.

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
	case d < 100*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	default:
		return fmt.Sprintf("%.0fs", d.Seconds())
	}
}

func fmtSeconds(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return fmtDur(time.Duration(s * float64(time.Second)))
}

func fmtLimit(d time.Duration) string {
	s := d.String()
	s = strings.TrimSuffix(s, "0s")
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if s == "" {
		return "0s"
	}
	return s
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want a positive number", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty")
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s k8s-bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "k8s-bench:", err)
	os.Exit(2)
}

// Cleanup on signals: the first SIGINT/SIGTERM cancels the run, which
// unwinds through the deferred Close/Stop calls and prints what was
// measured; a second signal, or 60 s without the unwinding finishing,
// closes every sandbox and control plane at once and exits.

var live struct {
	sync.Mutex
	cps map[*controlplane.ControlPlane]bool
}

func track(cp *controlplane.ControlPlane) (untrack func()) {
	live.Lock()
	if live.cps == nil {
		live.cps = map[*controlplane.ControlPlane]bool{}
	}
	live.cps[cp] = true
	live.Unlock()
	return func() {
		live.Lock()
		delete(live.cps, cp)
		live.Unlock()
	}
}

func handleSignals(cancel context.CancelFunc) {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-ch
		logf("%v: stopping (again to force)", sig)
		cancel()
		select {
		case <-ch:
		case <-time.After(60 * time.Second):
		}
		logf("forcing: removing the sandboxes and stopping the control plane")
		sandbox.CloseAll()
		live.Lock()
		for cp := range live.cps {
			_ = cp.Stop()
		}
		live.Unlock()
		os.Exit(130)
	}()
}
