package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupHierarchies returns the mount points of every cgroup hierarchy
// (v1 controllers and the v2 one of a hybrid layout), the first mount of
// each: another suite may mount a hierarchy again elsewhere (the eBPF
// tests mount cgroup2 under /tmp), and that second mount is no hierarchy
// of its own.
func cgroupHierarchies() ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 4 && (fields[2] == "cgroup" || fields[2] == "cgroup2") {
			// The type and options name the hierarchy (v1: its
			// controllers; v2: there is one).
			key := fields[2] + " " + fields[3]
			if fields[2] == "cgroup2" {
				key = fields[2]
			}
			if seen[key] {
				continue
			}
			seen[key] = true
			dirs = append(dirs, fields[1])
		}
	}
	if len(dirs) == 0 {
		return nil, errors.New("no cgroup hierarchy mounted")
	}
	return dirs, sc.Err()
}

// makeCgroup creates name (a path such as "steelyard-node-1/runtime") in
// every hierarchy. A new cpuset cgroup of v1 starts with no CPUs and no
// memory nodes: copy the parent's, as runc does.
func makeCgroup(name string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := h
		for _, part := range strings.Split(name, "/") {
			parent := dir
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					cur, _ := os.ReadFile(filepath.Join(dir, f))
					if strings.TrimSpace(string(cur)) == "" {
						if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
							return fmt.Errorf("%s: %w", filepath.Join(dir, f), err)
						}
					}
				}
			}
		}
	}
	return nil
}

// joinCgroup moves pid into name in every hierarchy.
func joinCgroup(name string, pid int) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		if err := os.WriteFile(filepath.Join(h, name, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// cgroupPids returns every process in the tree under name, in any hierarchy.
func cgroupPids(name string) []int {
	hs, _ := cgroupHierarchies()
	seen := map[int]bool{}
	var pids []int
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeCgroup SIGKILLs every process in the tree under name (containerd,
// its shims, every container, kubelet) until none is left, then removes the
// tree from every hierarchy, deepest first.
func removeCgroup(name string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids := cgroupPids(name)
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v do not die", name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	hs, _ := cgroupHierarchies()
	var errs []error
	for _, h := range hs {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(h, name), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			// A killed process may take a moment to leave its cgroup.
			for i := 0; i < 50; i++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// mountsUnder returns the mount points at or below dir in this mount
// namespace, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	var ms []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[1] == dir || strings.HasPrefix(f[1], dir+"/")) {
			ms = append(ms, f[1])
		}
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	return ms
}

// unmountUnder lazily unmounts everything at or below dir.
func unmountUnder(dir string) error {
	var errs []error
	for _, m := range mountsUnder(dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("umount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

func netListenLoopback() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
