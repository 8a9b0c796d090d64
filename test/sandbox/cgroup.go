package sandbox

import (
	"errors"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// OwnCgroup returns this process's cgroup in the unified (v2) hierarchy,
// "/" for its root. The ebpf mode's suites and benchmarks move their
// clients into a sub-cgroup of their own and back, so they need it.
func OwnCgroup() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 line in /proc/self/cgroup")
}

// UnifiedRoot returns where the cgroup v2 (unified) hierarchy is mounted:
// /sys/fs/cgroup/unified on a hybrid layout (this host's), or
// /sys/fs/cgroup where cgroup2 is the only hierarchy (the VM's guest,
// scripts/vm/run.sh). The ebpf mode's suites make their sub-cgroups there.
func UnifiedRoot() (string, error) {
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return dir, nil
		}
	}
	return "", errors.New("no cgroup2 mount at /sys/fs/cgroup/unified or /sys/fs/cgroup")
}
