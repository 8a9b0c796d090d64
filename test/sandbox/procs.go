package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Processes returns "pid cmdline" of the live (not zombie) processes whose
// network namespace is n: what an agent left behind after it exited.
func (n *NS) Processes() ([]string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(n.path, &st); err != nil {
		return nil, err
	}
	var out []string
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var pst syscall.Stat_t
		if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &pst); err != nil || pst.Ino != st.Ino || pst.Dev != st.Dev {
			continue
		}
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if s := string(stat); strings.Contains(s, ") Z ") {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimSpace(string(cmd)), "\x00", " ")))
	}
	return out, nil
}
