package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// procStat is what we use of /proc/<pid>/stat.
type procStat struct {
	ppid int
	// self is utime+stime; children is cutime+cstime, the CPU time of
	// descendants that have exited and been waited for (iptables-restore,
	// nft and the like, which the proxies wait for).
	self, children uint64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may hold spaces: split after
	// the last ')'. The fields then start at field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	num := func(k int) uint64 { v, _ := strconv.ParseUint(f[k], 10, 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	// fields 14-17: utime, stime, cutime, cstime
	return procStat{ppid: ppid, self: num(11) + num(12), children: num(13) + num(14)}, nil
}

// treeCPU returns the CPU seconds used so far by pid and its descendants:
// pid's own time, the time of the descendants it has waited for, and the
// time of the descendants still running (found by walking /proc). No
// cgroup is needed.
func treeCPU(pid int) (float64, error) {
	root, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := root.self + root.children
	// Live descendants: their time is not yet in any cutime of the tree.
	kids := map[int][]int{}
	stats := map[int]procStat{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		p, err := strconv.Atoi(filepath.Base(d))
		if err != nil || p == pid {
			continue
		}
		st, err := readStat(p)
		if err != nil {
			continue // exited meanwhile
		}
		stats[p] = st
		kids[st.ppid] = append(kids[st.ppid], p)
	}
	queue := append([]int(nil), kids[pid]...)
	for len(queue) > 0 && len(queue) < 1<<16 {
		p := queue[0]
		queue = queue[1:]
		ticks += stats[p].self + stats[p].children
		queue = append(queue, kids[p]...)
	}
	return float64(ticks) / clockTicks, nil
}

// peakRSS returns VmHWM of pid in KiB: the peak resident set of the
// process itself (its short-lived children are not included).
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}
