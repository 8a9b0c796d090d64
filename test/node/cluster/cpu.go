package cluster

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CPUUsage is the CPU time used so far by everything in the node's cgroup
// (containerd, kubelet, every pod), and by each live pod, keyed by pod
// UID. It reads cgroup v1's cpuacct (this machine's layout), whose counts
// are hierarchical: a pod that has gone still counts in Total.
func (c *Cluster) CPUUsage() (total time.Duration, pods map[string]time.Duration, err error) {
	hs, err := cgroupHierarchies()
	if err != nil {
		return 0, nil, err
	}
	root := ""
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h, "cpuacct.usage")); err == nil {
			root = filepath.Join(h, c.cgroup)
			break
		}
	}
	if root == "" {
		return 0, nil, errors.New("no cpuacct hierarchy")
	}
	total, err = usage(root)
	if err != nil {
		return 0, nil, err
	}
	pods = map[string]time.Duration{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if name := d.Name(); strings.HasPrefix(name, "pod") {
			if u, err := usage(p); err == nil {
				pods[strings.ReplaceAll(strings.TrimPrefix(name, "pod"), "_", "-")] = u
			}
			return filepath.SkipDir
		}
		return nil
	})
	return total, pods, nil
}

func usage(dir string) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(ns), err
}
