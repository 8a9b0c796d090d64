package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Counters are a network namespace's packet counters by name: the TCP
// and IP statistics (/proc/net/netstat, snmp, snmp6) and conntrack's
// (/proc/net/stat/nf_conntrack, summed over the CPUs), as "TcpExt
// ListenDrops", "Tcp AttemptFails", "conntrack insert_failed".
type Counters map[string]uint64

// Counters reads this namespace's counters (from the thread that Do puts
// in it: /proc/thread-self, not /proc/self, which shows the netns of the
// process's main thread). A file the kernel lacks (no conntrack loaded,
// no IPv6) is left out.
func (n *NS) Counters() (Counters, error) {
	c := Counters{}
	err := n.Do(func() error {
		for _, f := range []string{"netstat", "snmp"} {
			if err := c.readPairs("/proc/thread-self/net/" + f); err != nil && !os.IsNotExist(err) {
				return err
			}
		}
		if err := c.readFlat("/proc/thread-self/net/snmp6"); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := c.readConntrack("/proc/thread-self/net/stat/nf_conntrack"); err != nil && !os.IsNotExist(err) {
			return err
		}
		return nil
	})
	return c, err
}

// readPairs reads netstat/snmp: a header line "Prefix: name name ..."
// followed by a value line "Prefix: v v ...".
func (c Counters) readPairs(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) != len(values) || len(names) == 0 {
			return fmt.Errorf("%s: malformed pair at line %d", path, i+1)
		}
		prefix := strings.TrimSuffix(names[0], ":")
		for k := 1; k < len(names); k++ {
			if v, err := strconv.ParseInt(values[k], 10, 64); err == nil && v >= 0 {
				c[prefix+" "+names[k]] = uint64(v)
			}
		}
	}
	return nil
}

// readFlat reads snmp6: "name value" per line.
func (c Counters) readFlat(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 2 {
			if v, err := strconv.ParseUint(fs[1], 10, 64); err == nil {
				c[fs[0]] = v
			}
		}
	}
	return sc.Err()
}

// readConntrack reads conntrack's per-CPU statistics: a header of names,
// then one line of hex values per CPU.
func (c Counters) readConntrack(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		return nil
	}
	names := strings.Fields(lines[0])
	for _, l := range lines[1:] {
		for k, h := range strings.Fields(l) {
			if k >= len(names) || names[k] == "entries" {
				continue
			}
			if v, err := strconv.ParseUint(h, 16, 64); err == nil {
				c["conntrack "+names[k]] += v
			}
		}
	}
	return nil
}

// dropWords mark the counters that tell where packets or connections were
// lost (and the retransmissions that follow).
var dropWords = []string{"drop", "fail", "overflow", "err", "retrans", "timeout", "rst", "reset",
	"invalid", "clash", "challenge", "paws", "tw", "prune", "search_restart", "ignore", "noroute", "discard",
	"cookie", "reqq", "backlog", "abort", "listen"}

// Grown returns the loss-related counters that grew from before to c, as
// "name +delta", sorted by name.
func (c Counters) Grown(before Counters) []string {
	var out []string
	for name, v := range c {
		if v <= before[name] {
			continue
		}
		d := v - before[name]
		low := strings.ToLower(name)
		for _, w := range dropWords {
			if strings.Contains(low, w) {
				out = append(out, fmt.Sprintf("%s +%d", name, d))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// Snapshot holds the counters of every namespace of a sandbox, by name.
type Snapshot map[string]Counters

// Of returns the open sandbox that holds namespace n, or nil.
func Of(n *NS) *Sandbox {
	registryMu.Lock()
	defer registryMu.Unlock()
	for s := range registry {
		s.mu.Lock()
		found := false
		for _, m := range s.namespaces {
			found = found || m == n
		}
		s.mu.Unlock()
		if found {
			return s
		}
	}
	return nil
}

// Counters reads the counters of every namespace of the sandbox; one that
// cannot be read is left out.
func (s *Sandbox) Counters() Snapshot {
	s.mu.Lock()
	nss := append([]*NS(nil), s.namespaces...)
	s.mu.Unlock()
	snap := Snapshot{}
	for _, n := range nss {
		if c, err := n.Counters(); err == nil {
			snap[n.Name] = c
		}
	}
	return snap
}

// Grown describes, per namespace, the loss-related counters that grew
// since before: one line per namespace with any, sorted.
func (after Snapshot) Grown(before Snapshot) []string {
	var out []string
	for name, c := range after {
		if g := c.Grown(before[name]); len(g) > 0 {
			out = append(out, name+": "+strings.Join(g, ", "))
		}
	}
	sort.Strings(out)
	return out
}
