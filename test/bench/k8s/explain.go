package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// explainArgv is what "explain" runs for a proxy in its namespace:
// steelyard explain in the proxy's mode (reading the kernel back and
// computing every VIP's shares); kube-proxy has no explain, so its nearest
// equivalent, listing its rules: nft list ruleset, iptables-save.
func explainArgv(bins binaries, p proxy) []string {
	switch p.name {
	case proxySteelyard:
		return []string{bins.steelyard, "explain", "--mode", "iptables", "--iptables-mode", p.flavour}
	case proxySteelyardNFTables:
		return []string{bins.steelyard, "explain", "--mode", "nftables"}
	case proxySteelyardEBPF:
		return []string{bins.steelyard, "explain", "--mode", "ebpf", "--bpf-pin-dir", p.pinDir}
	case proxyKubeProxyIPTables:
		return []string{"iptables-" + p.flavour + "-save"}
	}
	return []string{"nft", "list", "ruleset"}
}

// explainName is explainArgv without the binary's path.
func explainName(argv []string) string {
	name := argv[0]
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	out := []string{name}
	for i, a := range argv[1:] {
		if i > 0 && argv[i] == "--bpf-pin-dir" {
			a = "PINS" // the run's temporary bpffs
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// timeExplain runs explainArgv once in namespace ns: its wall time, its CPU
// seconds (user + system of the process and its waited-for children, from
// wait4), the command, and an error text when it failed or printed
// nothing.
func timeExplain(ctx context.Context, cfg *config, ns string, p proxy) (wall, cpu float64, name, errText string) {
	argv := explainArgv(cfg.bins, p)
	name = explainName(argv)
	ctx, cancel := context.WithTimeout(ctx, cfg.explainTimeout)
	defer cancel()
	// ip netns exec execs the command: the PID, and wait4's usage, are
	// the command's.
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	var out countWriter
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	t := time.Now()
	err := cmd.Run()
	wall = time.Since(t).Seconds()
	if st := cmd.ProcessState; st != nil {
		cpu = (st.UserTime() + st.SystemTime()).Seconds()
	}
	switch {
	case ctx.Err() == context.DeadlineExceeded:
		errText = fmt.Sprintf("timeout (> %s)", fmtLimit(cfg.explainTimeout))
	case err != nil:
		errText = fmt.Sprintf("%v: %s", err, lastLines(stderr.String(), 3))
	case out.n == 0:
		errText = "printed nothing"
	}
	logf("%s: %s: %.2f s, %.2f CPU-s, %d bytes%s", p.label(), name, wall, cpu, out.n, map[bool]string{true: ", " + errText, false: ""}[errText != ""])
	return wall, cpu, name, errText
}

// countWriter counts what is written to it.
type countWriter struct{ n int64 }

func (c *countWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

var _ io.Writer = (*countWriter)(nil)
