package sandbox

import (
	"errors"
	"os"
	"strings"
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
