//go:build e2e

package nftables

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// inThrowawayNetns makes a kernel test run in a network namespace of its
// own: in the parent it creates the namespace (prefix and the time),
// runs this test binary again there with env set, only this test, and
// removes the namespace, also on failure; it returns true in that child,
// where the caller runs the test's body. A kernel test (tag e2e, run as
// root by make e2e after scripts/install-deps.sh installed nft) must not
// pass by skipping, so missing root or nft fails it.
func inThrowawayNetns(t *testing.T, env, prefix string) bool {
	t.Helper()
	if os.Getenv(env) != "" {
		return true
	}
	if os.Geteuid() != 0 {
		t.Fatal("needs root (runs itself in a throwaway network namespace): run it with sudo")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Fatalf("no nft binary (scripts/install-deps.sh installs it): %v", err)
	}
	ns := prefix + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run() //nolint:errcheck
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+ns)
	out, err := cmd.CombinedOutput()
	t.Logf("in %s:\n%s", ns, out)
	if err != nil {
		t.Fatal(err)
	}
	return false
}
