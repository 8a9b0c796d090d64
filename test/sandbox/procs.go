package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// NetnsID identifies a network namespace by its nsfs inode, which stays
// valid while any process holds the namespace, even after its name in
// /run/netns is gone.
type NetnsID struct{ Dev, Ino uint64 }

// NetnsOf returns the ID of the namespace file at path (/run/netns/<name>
// or /proc/<pid>/ns/net).
func NetnsOf(path string) (NetnsID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return NetnsID{}, err
	}
	return NetnsID{Dev: st.Dev, Ino: st.Ino}, nil
}

// Processes returns "pid cmdline" of the live (not zombie) processes whose
// network namespace is n: what an agent left behind after it exited.
func (n *NS) Processes() ([]string, error) {
	id, err := NetnsOf(n.path)
	if err != nil {
		return nil, err
	}
	return ProcessesIn(id)
}

// ProcessesIn returns "pid cmdline" of the live (not zombie) processes
// whose network namespace is id.
func ProcessesIn(id NetnsID) ([]string, error) {
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
		if got, err := NetnsOf(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil || got != id {
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
