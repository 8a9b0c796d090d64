package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The timeouts are written in seconds under --sysctl-dir, kube-proxy's
// defaults by default; zero leaves a sysctl as it is, and one that cannot
// be written (no file) does not stop the others.
func TestConntrackTimeouts(t *testing.T) {
	dir := t.TempDir()
	nf := filepath.Join(dir, "net", "netfilter")
	if err := os.MkdirAll(nf, 0o755); err != nil {
		t.Fatal(err)
	}
	est, cw := filepath.Join(nf, "nf_conntrack_tcp_timeout_established"), filepath.Join(nf, "nf_conntrack_tcp_timeout_close_wait")
	write := func(p, v string) {
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	write(est, "432000")
	write(cw, "60")
	conntrackTimeouts{established: 24 * time.Hour, closeWait: time.Hour}.apply(dir)
	if got := read(est); got != "86400" {
		t.Errorf("established: %q, want 86400", got)
	}
	if got := read(cw); got != "3600" {
		t.Errorf("close_wait: %q, want 3600", got)
	}

	write(est, "432000")
	write(cw, "60")
	conntrackTimeouts{closeWait: 90 * time.Second}.apply(dir)
	if got := read(est); got != "432000\n" {
		t.Errorf("established with 0: %q, want it left as it was", got)
	}
	if got := read(cw); got != "90" {
		t.Errorf("close_wait: %q, want 90", got)
	}

	if err := os.Remove(est); err != nil {
		t.Fatal(err)
	}
	conntrackTimeouts{established: time.Hour, closeWait: 2 * time.Hour}.apply(dir)
	if got := read(cw); got != "7200" {
		t.Errorf("close_wait beside a missing sysctl: %q, want 7200", got)
	}
	if _, err := os.Stat(est); err == nil {
		t.Errorf("a missing sysctl was created")
	}
}

// run's defaults are kube-proxy's (24h, 1h).
func TestConntrackTimeoutDefaults(t *testing.T) {
	cmd := newRunCommand()
	for name, want := range map[string]string{"conntrack-tcp-timeout-established": "24h0m0s", "conntrack-tcp-timeout-close-wait": "1h0m0s"} {
		f := cmd.Flags().Lookup(name)
		if f == nil || f.DefValue != want {
			t.Errorf("--%s: %v, want default %s", name, f, want)
		}
	}
}
