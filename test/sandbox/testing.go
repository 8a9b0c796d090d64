package sandbox

import (
	"strings"
	"testing"
)

// NewT creates a sandbox for a test: it fails the test (t.Fatal, never
// Skip) when not root, logs each step with t.Logf, and registers Close with
// t.Cleanup (which also runs when the test panics). When the test failed,
// the cleanup first logs the tail of every agent log.
func NewT(t testing.TB, opts Options) *Sandbox {
	t.Helper()
	RequireRoot(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("sandbox: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for i, a := range s.Agents() {
				t.Logf("agent %d log (%s), last lines:\n%s", i+1, a.LogPath, tail(a.Log(), 60))
			}
		}
		if err := s.Close(); err != nil {
			t.Errorf("sandbox close: %v", err)
		}
	})
	return s
}

// RequireRoot fails the test when it does not run as root: kernel tests
// must not pass silently by skipping.
func RequireRoot(t testing.TB) {
	t.Helper()
	if !IsRoot() {
		t.Fatal("this test needs root (network namespaces, iptables): run it with sudo")
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
