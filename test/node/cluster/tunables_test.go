package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeStore is a store over a temporary /proc/sys holding hostTunables at
// "0", where the owners in live run.
func fakeStore(t *testing.T, live map[string]bool) tunableStore {
	t.Helper()
	s := tunableStore{Dir: t.TempDir(), ProcSys: t.TempDir(), Alive: func(o string) bool { return live[o] }}
	for _, k := range hostTunables {
		p := filepath.Join(s.ProcSys, k)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		set(t, s, k, "0")
	}
	return s
}

func set(t *testing.T, s tunableStore, k, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(s.ProcSys, k), []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, s tunableStore, k string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.ProcSys, k))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The bug this record fixes: a second cluster started after the first's
// kubelet recorded kubelet's values and left them on the host.
func TestTunablesConcurrentOwnersRestoreTheOriginals(t *testing.T) {
	live := map[string]bool{"a": true, "b": true}
	s := fakeStore(t, live)
	const k = "vm/overcommit_memory"
	if _, err := s.Acquire("a"); err != nil {
		t.Fatal(err)
	}
	set(t, s, k, "1") // a's kubelet
	if _, err := s.Acquire("b"); err != nil {
		t.Fatal(err)
	}
	if restored, err := s.Release("a"); err != nil || len(restored) > 0 {
		t.Fatalf("first owner out restored %v (%v); b's kubelet still runs", restored, err)
	}
	if got := get(t, s, k); got != "1" {
		t.Fatalf("%s = %s while b runs, want kubelet's 1", k, got)
	}
	restored, err := s.Release("b")
	if err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, k); got != "0" || len(restored) != 1 {
		t.Fatalf("after the last owner: %s = %s (restored %v), want the original 0", k, got, restored)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, tunableRecordFile)); !os.IsNotExist(err) {
		t.Fatalf("record left behind: %v", err)
	}
}

// A killed owner never releases: the next Acquire or Prune restores for it,
// and a new record starts from the true originals.
func TestTunablesKilledOwnerIsPruned(t *testing.T) {
	live := map[string]bool{"a": true}
	s := fakeStore(t, live)
	const k = "kernel/panic"
	if _, err := s.Acquire("a"); err != nil {
		t.Fatal(err)
	}
	set(t, s, k, "10")
	live["a"] = false // SIGKILLed
	live["b"] = true
	restored, err := s.Acquire("b")
	if err != nil {
		t.Fatal(err)
	}
	if get(t, s, k) != "0" || len(restored) != 1 {
		t.Fatalf("dead owner's values not restored before b recorded: %s=%s, restored %v", k, get(t, s, k), restored)
	}
	set(t, s, k, "10") // b's kubelet
	live["b"] = false
	if _, err := s.Prune(); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, k); got != "0" {
		t.Fatalf("Prune with no live owner left %s=%s", k, got)
	}
}
