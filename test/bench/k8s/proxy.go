package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Proxy names for -proxies.
const (
	proxySteelyard         = "steelyard"
	proxyKubeProxyIPTables = "kube-proxy-iptables"
	proxyKubeProxyNFTables = "kube-proxy-nftables"
	// proxySteelyardNFTables is steelyard --mode nftables (its own table,
	// no iptables flavour), measured beside kube-proxy's nftables mode.
	proxySteelyardNFTables = "steelyard-nftables"
	// proxySteelyardEBPF is steelyard --mode ebpf: cgroup socket programs
	// for the clusterIPs, beside the nftables rules of every entry point.
	proxySteelyardEBPF = "steelyard-ebpf"
)

// knownProxy reports whether base (a -proxies name without its -msp
// suffix) is a proxy k8s-bench runs.
func knownProxy(base string) bool {
	switch base {
	case proxySteelyard, proxyKubeProxyIPTables, proxyKubeProxyNFTables, proxySteelyardNFTables, proxySteelyardEBPF:
		return true
	}
	return false
}

// steelyard reports whether the proxy is steelyard (either mode).
func (p proxy) steelyard() bool {
	return p.name == proxySteelyard || p.name == proxySteelyardNFTables || p.name == proxySteelyardEBPF
}

// Metrics and health addresses inside each proxy's namespace.
const (
	steelyardMetrics = "127.0.0.1:10279"
	steelyardHealthz = "127.0.0.1:10276"
	kubeProxyMetrics = "127.0.0.1:10249"
	kubeProxyHealthz = "127.0.0.1:10256"
)

// clusterCIDR is the pod range given to both proxies (sandbox.ClusterCIDR).
var clusterCIDR = sandbox.ClusterCIDR.String()

// proxy is one proxy configuration to measure.
type proxy struct {
	name    string // proxySteelyard, ...
	flavour string // "legacy" or "nft" (iptables flavour); "" for nftables mode
	// minSync is the --min-sync-period given to the proxy ("250ms"); ""
	// leaves its default (minSyncDefault).
	minSync string
	// ebpf mode: the cgroup v2 directory and the pin dir of this run
	// (ebpfEnv).
	cgroupPath, pinDir string
}

func (p proxy) label() string {
	l := "kube-proxy nftables"
	switch p.name {
	case proxySteelyard:
		l = "steelyard (iptables)"
	case proxySteelyardNFTables:
		l = "steelyard nftables"
	case proxySteelyardEBPF:
		l = "steelyard ebpf"
	case proxyKubeProxyIPTables:
		l = "kube-proxy iptables"
	}
	if p.minSync != "" {
		l += " --min-sync-period " + p.minSync
	}
	return l
}

// id is the proxy's -proxies name ("kube-proxy-nftables-msp250ms").
func (p proxy) id() string {
	if p.minSync != "" {
		return p.name + "-msp" + p.minSync
	}
	return p.name
}

// minSyncPeriod is the --min-sync-period the proxy runs with: the one
// given, else the flag's default (steelyard 250 ms, kube-proxy 1 s).
func (p proxy) minSyncPeriod() string {
	switch {
	case p.minSync != "":
		return p.minSync
	case p.steelyard():
		return "250ms"
	}
	return "1s"
}

func (p proxy) flavourLabel() string {
	if p.flavour == "" {
		return "-"
	}
	return p.flavour
}

func (p proxy) metricsPrefix() string {
	if p.steelyard() {
		return "steelyard_"
	}
	return "kubeproxy_"
}

// binaries are the executables the runs need.
type binaries struct {
	steelyard string
	kubeProxy string
}

// command returns the argv that starts the proxy (run inside its namespace
// by `ip netns exec`, which execs it: the PID is the proxy's). For
// kube-proxy in iptables mode, the argv starts with env(1) putting wrapDir
// first on PATH, so "iptables", "iptables-save" and "iptables-restore"
// (and the ip6tables ones) are the chosen flavour.
func (p proxy) command(bins binaries, kubeconfig, wrapDir string) (string, []string) {
	var msp []string
	if p.minSync != "" {
		msp = []string{"--min-sync-period", p.minSync}
	}
	if p.name == proxySteelyardNFTables || p.name == proxySteelyardEBPF {
		mode := "nftables"
		if p.name == proxySteelyardEBPF {
			mode = "ebpf"
		}
		args := []string{"run",
			"--kubeconfig", kubeconfig,
			"--node-name", nodeName,
			"--mode", mode,
			"--cluster-cidr", clusterCIDR,
			"--metrics-bind-address", steelyardMetrics,
			"--healthz-bind-address", steelyardHealthz,
		}
		if p.name == proxySteelyardEBPF {
			args = append(args, "--cgroup-path", p.cgroupPath, "--bpf-pin-dir", p.pinDir)
		}
		return bins.steelyard, append(args, msp...)
	}
	if p.name == proxySteelyard {
		return bins.steelyard, append([]string{"run",
			"--kubeconfig", kubeconfig,
			"--node-name", nodeName,
			"--mode", "iptables",
			"--iptables-mode", p.flavour,
			"--cluster-cidr", clusterCIDR,
			"--metrics-bind-address", steelyardMetrics,
			"--healthz-bind-address", steelyardHealthz,
		}, msp...)
	}
	mode := "iptables"
	if p.name == proxyKubeProxyNFTables {
		mode = "nftables"
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--proxy-mode", mode,
		"--hostname-override", nodeName,
		"--cluster-cidr", clusterCIDR,
		"--metrics-bind-address", kubeProxyMetrics,
		"--healthz-bind-address", kubeProxyHealthz,
		// Leave every conntrack setting as it is: nf_conntrack_max and
		// the hash size are host-wide, and the namespace's own timeouts
		// do not matter here.
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
		"--oom-score-adj", "0",
	}
	if p.minSync != "" {
		// kube-proxy's flag for it in every mode but ipvs (the config
		// file's minSyncPeriod; options.go, processV1Alpha1Flags).
		args = append(args, "--iptables-min-sync-period", p.minSync)
	}
	if wrapDir == "" {
		return bins.kubeProxy, args
	}
	env, err := exec.LookPath("env")
	if err != nil {
		env = "/usr/bin/env"
	}
	return env, append([]string{"PATH=" + wrapDir + ":" + os.Getenv("PATH"), bins.kubeProxy}, args...)
}

// iptablesWrapDir makes a directory whose iptables, iptables-save,
// iptables-restore and ip6tables* are symlinks to the flavour's tools
// (iptables-legacy, ...): xtables-*-multi picks the command by the link's
// own name and the flavour by the target. Remove it when done.
func iptablesWrapDir(flavour string) (string, error) {
	dir, err := os.MkdirTemp("", "k8s-bench-"+flavour+"-")
	if err != nil {
		return "", err
	}
	for _, tool := range []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"} {
		parts := strings.SplitN(tool, "-", 2)
		target := parts[0] + "-" + flavour
		if len(parts) == 2 {
			target += "-" + parts[1]
		}
		path, err := exec.LookPath(target)
		if err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("%s: %w", target, err)
		}
		if err := os.Symlink(path, filepath.Join(dir, tool)); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// kernelDump is how to read a proxy's rules back from its namespace.
type kernelDump struct {
	argv []string
}

func (p proxy) kernelDump() kernelDump {
	if p.name == proxyKubeProxyNFTables {
		return kernelDump{argv: []string{"nft", "list", "table", "ip", "kube-proxy"}}
	}
	if p.name == proxySteelyardNFTables {
		// Endpoint chains hold "dnat to IP:PORT", as endpointRE reads.
		return kernelDump{argv: []string{"nft", "list", "table", "ip", "steelyard"}}
	}
	return kernelDump{argv: []string{"iptables-" + p.flavour + "-save", "-t", "nat"}}
}

// nftTable is the nftables table (family ip) the proxy writes in nftables
// mode, "" for the iptables modes.
func (p proxy) nftTable() string {
	switch p.name {
	case proxyKubeProxyNFTables:
		return "kube-proxy"
	case proxySteelyardNFTables:
		return "steelyard"
	}
	return ""
}

// endpointRE matches one DNAT destination to an endpoint: iptables'
// "--to-destination IP:8080", nft's "dnat to IP:8080" (a Service with one
// endpoint, or an endpoint chain) and the "N : IP . 8080" entries of the
// numgen map kube-proxy's nftables mode puts inline in a Service chain
// ("dnat ip to numgen random mod 10 map { 0 : IP . 8080, ... }").
var endpointRE = regexp.MustCompile(`(?:--to-destination |dnat to |: )(198\.19\.[0-9]+\.[0-9]+)(?::| \. )` +
	strconv.Itoa(endpointPort) + `(?:[^0-9]|$)`)

// scan dumps the rules in namespace ns and returns the number of DNAT
// destinations in 198.19.0.0/16 (one per endpoint of every Service, for
// steelyard and both kube-proxy modes) and whether one of them is want (an
// address; the port is endpointPort).
func (k kernelDump) scan(ctx context.Context, ns string, want string) (count int, found bool, err error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, k.argv...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, false, err
	}
	if err := cmd.Start(); err != nil {
		return 0, false, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "198.19.") {
			continue
		}
		for _, m := range endpointRE.FindAllStringSubmatch(line, -1) {
			count++
			if m[1] == want {
				found = true
			}
		}
	}
	scanErr := sc.Err()
	if scanErr != nil {
		_, _ = io.Copy(io.Discard, out) // let the dump finish
	}
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return count, found, ctx.Err()
		}
		// "No such file or directory": no table before the first sync.
		if strings.Contains(stderr.String(), "No such file or directory") {
			return 0, false, nil
		}
		return count, found, fmt.Errorf("%s: %w: %s", strings.Join(k.argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return count, found, scanErr
}
