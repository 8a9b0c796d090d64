// Command demo shows steelyard splitting real connections by weight, on this
// machine, without touching its network: it builds a sandbox node (network
// namespaces, see test/sandbox) with one pod per endpoint of the example
// manifests, runs the agent in the node namespace, sends connections from a
// client namespace to every Service VIP and compares the shares each pod
// received with the shares the kernel is programmed with.
//
// Run as root:
//
//	go run ./test/demo --steelyard bin/steelyard --examples examples
//
// It exits 1 when a backend's observed share is off by more than --tolerance
// points, 2 when the demo could not run. Ctrl-C removes the sandbox.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Why 10,000 connections per VIP: the count a backend with share p receives
// is binomial, so its observed share has a standard deviation of
// sqrt(p(1-p)/N). For the 40% backend of quad (1:2:3:4) that is 0.49 points
// at N = 10,000, and the 2-point check sits at 4.1 sigma: a correct
// dataplane fails it about once in 25,000 runs. At N = 2,000 the same
// backend has a standard deviation of 1.1 points, 2 points is only 1.8
// sigma, and the four backends of quad together would fail about 15% of
// runs of a perfectly working agent.
const defaultConnections = 10000

type options struct {
	binary       string
	examples     string
	connections  int
	tolerance    float64
	iptablesMode string
	concurrency  int
}

func main() {
	var o options
	flag.StringVar(&o.binary, "steelyard", "bin/steelyard", "the steelyard binary")
	flag.StringVar(&o.examples, "examples", "examples", "directory of Service and EndpointSlice manifests")
	flag.IntVar(&o.connections, "connections", defaultConnections, "new connections (or UDP flows) per Service VIP")
	flag.Float64Var(&o.tolerance, "tolerance", 2, "allowed difference between configured and observed share, in percentage points")
	flag.StringVar(&o.iptablesMode, "iptables-mode", "auto", "passed to the agent: auto, nft or legacy")
	flag.IntVar(&o.concurrency, "concurrency", 32, "connections in flight")
	flag.Parse()

	stop := sandbox.CloseOnSignal()
	code := run(o, os.Stdout)
	stop()
	sandbox.CloseAll()
	os.Exit(code)
}

// endpoint is one endpoint found in the examples' EndpointSlices.
type endpoint struct {
	pod   string
	ip    netip.Addr
	ports []uint16
}

func run(o options, out io.Writer) int {
	if !sandbox.IsRoot() {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces and iptables); try sudo")
		return 2
	}
	if o.connections <= 0 || o.connections > 100000 {
		fmt.Fprintln(os.Stderr, "demo: --connections must be in 1..100000")
		return 2
	}
	binary, err := filepath.Abs(o.binary)
	if err == nil {
		_, err = os.Stat(binary)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: steelyard binary: %v (build it with: go build -o bin/steelyard ./cmd/steelyard)\n", err)
		return 2
	}
	examples, err := filepath.Abs(o.examples)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	endpoints, err := readEndpoints(examples)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}

	sb, err := sandbox.New(sandbox.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	defer sb.Close()
	failed := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "demo: "+format+"\n", args...)
		for _, a := range sb.Agents() {
			fmt.Fprintf(os.Stderr, "--- agent log %s ---\n%s", a.LogPath, a.Log())
		}
		return 2
	}

	byAddr := map[netip.AddrPort]string{} // backend -> pod name
	for _, ep := range endpoints {
		if _, err := sb.AddPod(ep.pod, ep.ip, ep.ports...); err != nil {
			return failed("%v", err)
		}
		for _, p := range ep.ports {
			byAddr[netip.AddrPortFrom(ep.ip, p)] = ep.pod
		}
	}
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		return failed("%v", err)
	}
	fmt.Fprintf(out, "sandbox %s: node %s, client %s, %d pods (namespaces %s-*)\n",
		sb.Name, sandbox.NodeIP, client.Addr, len(endpoints), sb.Name)

	modeArgs := []string{"--mode", "iptables", "--iptables-mode", o.iptablesMode}
	agent, err := sb.StartAgent(binary, append([]string{"run", "--manifests", examples,
		"--cluster-cidr", sandbox.ClusterCIDR.String()}, modeArgs...)...)
	if err != nil {
		return failed("%v", err)
	}
	start := time.Now()
	if err := waitVerified(sb, agent, binary, examples, modeArgs, 20*time.Second); err != nil {
		return failed("%v", err)
	}
	fmt.Fprintf(out, "agent programmed the node in %s (steelyard verify passes)\n\n", time.Since(start).Round(time.Millisecond))

	js, err := sb.Node.Exec(append([]string{binary, "explain", "-o", "json"}, modeArgs...)...)
	if err != nil {
		return failed("explain: %v", err)
	}
	var views []view
	if err := json.Unmarshal([]byte(js), &views); err != nil {
		return failed("explain -o json: %v", err)
	}

	bad := 0
	for _, v := range views {
		if len(v.Backends) == 0 {
			fmt.Fprintf(out, "%s  %s:%d/%s: no backends (reject), skipped\n\n", v.Service, v.VIP, v.Port, v.Protocol)
			continue
		}
		dst := netip.AddrPortFrom(netip.MustParseAddr(v.VIP), v.Port)
		load := sandbox.Load{Concurrency: o.concurrency}
		var res sandbox.Result
		if strings.EqualFold(v.Protocol, "udp") {
			res, err = client.UDPFlows(dst, o.connections, load)
		} else {
			res, err = client.TCPConns(dst, o.connections, load)
		}
		if err != nil {
			return failed("%s: %v", v.Service, err)
		}
		bad += printTable(out, v, res, byAddr, o.tolerance)
	}

	fmt.Fprintln(out, "$ steelyard explain          (read back from the live kernel of the node namespace)")
	text, err := sb.Node.Exec(append([]string{binary, "explain"}, modeArgs...)...)
	if err != nil {
		return failed("explain: %v", err)
	}
	fmt.Fprintln(out, text)

	if len(views) > 0 {
		svc := views[0].Service
		for _, v := range views {
			if strings.Contains(v.Service, "/web:") {
				svc = v.Service
			}
		}
		save, err := iptablesSave(sb, o.iptablesMode)
		if err != nil {
			return failed("%v", err)
		}
		fmt.Fprintf(out, "$ iptables-save -t nat        (node namespace; the STEELYARD rules of %s)\n", svc)
		for _, l := range excerpt(save, svc) {
			fmt.Fprintln(out, l)
		}
		fmt.Fprintln(out)
	}

	if err := agent.Stop(); err != nil {
		fmt.Fprintf(out, "note: agent exit: %v\n", err)
	}
	if bad > 0 {
		fmt.Fprintf(out, "FAIL: %d backend(s) off by more than %.1f points\n", bad, o.tolerance)
		return 1
	}
	fmt.Fprintf(out, "OK: every backend within %.1f points of its configured share\n", o.tolerance)
	return 0
}

// view is one entry of `steelyard explain -o json`.
type view struct {
	Service  string `json:"service"`
	VIP      string `json:"vip"`
	Port     uint16 `json:"port"`
	Protocol string `json:"protocol"`
	Backends []struct {
		IP    string  `json:"ip"`
		Port  uint16  `json:"port"`
		Share float64 `json:"share"`
	} `json:"backends"`
	Reject bool `json:"reject"`
}

// printTable prints configured and observed shares of one VIP and returns
// how many rows are off by more than tolerance.
func printTable(out io.Writer, v view, res sandbox.Result, byAddr map[netip.AddrPort]string, tolerance float64) int {
	fmt.Fprintf(out, "%s  %s:%d/%s  %d connections in %s (%.0f/s)\n", v.Service, v.VIP, v.Port, v.Protocol,
		res.Attempted, res.Elapsed.Round(time.Millisecond), res.Rate())
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tpod\tconfigured\tobserved\tdiff\tcheck\t")
	bad := 0
	seen := map[string]bool{}
	for _, b := range v.Backends {
		addr := netip.AddrPortFrom(netip.MustParseAddr(b.IP), b.Port)
		pod := byAddr[addr]
		seen[pod] = true
		got := res.Share(pod)
		diff := got - b.Share
		verdict := "OK"
		if math.Abs(diff) > tolerance || pod == "" {
			verdict = "FAIL"
			bad++
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%.2f%%\t%+.2f\t%s\t\n", addr, pod, b.Share, got, diff, verdict)
	}
	for _, name := range res.Names() {
		if !seen[name] {
			fmt.Fprintf(tw, "?\t%s\t0.00%%\t%.2f%%\t%+.2f\tFAIL\t\n", name, res.Share(name), res.Share(name))
			bad++
		}
	}
	tw.Flush()
	if f := res.Failed(); f > 0 {
		fmt.Fprintf(out, "  %d connections failed: %v\n", f, res.Errors)
		if 100*float64(f)/float64(res.Attempted) > tolerance {
			bad++
		}
	}
	fmt.Fprintln(out)
	return bad
}

// waitVerified polls `steelyard verify` until it passes.
func waitVerified(sb *sandbox.Sandbox, agent *sandbox.Agent, binary, manifests string, modeArgs []string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if exited, err := agent.Exited(); exited {
			return fmt.Errorf("agent exited: %v", err)
		}
		_, last = sb.Node.Exec(append([]string{binary, "verify", "--manifests", manifests}, modeArgs...)...)
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("verify did not pass within %s: %v", timeout, last)
}

// readEndpoints returns one endpoint per pod named in the EndpointSlices of
// dir (ports merged when a pod appears in several slices), sorted by IP.
func readEndpoints(dir string) ([]endpoint, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	byPod := map[string]*endpoint{}
	for _, f := range files {
		switch strings.ToLower(filepath.Ext(f)) {
		case ".yaml", ".yml", ".json":
		default:
			continue
		}
		slices, err := readSlices(f)
		if err != nil {
			return nil, err
		}
		for _, sl := range slices {
			if sl.AddressType != discoveryv1.AddressTypeIPv4 {
				continue
			}
			for _, e := range sl.Endpoints {
				if e.TargetRef == nil || e.TargetRef.Name == "" || len(e.Addresses) == 0 {
					return nil, fmt.Errorf("%s: slice %s: every endpoint needs targetRef.name and an address", f, sl.Name)
				}
				ip, err := netip.ParseAddr(e.Addresses[0])
				if err != nil {
					return nil, fmt.Errorf("%s: slice %s: %w", f, sl.Name, err)
				}
				ep := byPod[e.TargetRef.Name]
				if ep == nil {
					ep = &endpoint{pod: e.TargetRef.Name, ip: ip}
					byPod[ep.pod] = ep
				} else if ep.ip != ip {
					return nil, fmt.Errorf("%s: pod %s has two addresses, %s and %s", f, ep.pod, ep.ip, ip)
				}
				for _, p := range sl.Ports {
					if p.Port != nil && !containsPort(ep.ports, uint16(*p.Port)) {
						ep.ports = append(ep.ports, uint16(*p.Port))
					}
				}
			}
		}
	}
	if len(byPod) == 0 {
		return nil, fmt.Errorf("no EndpointSlice endpoints found in %s", dir)
	}
	out := make([]endpoint, 0, len(byPod))
	for _, ep := range byPod {
		out = append(out, *ep)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ip.Less(out[j].ip) })
	return out, nil
}

func containsPort(ports []uint16, p uint16) bool {
	for _, q := range ports {
		if q == p {
			return true
		}
	}
	return false
}

// readSlices decodes the EndpointSlices of one YAML (multi-document) or JSON file.
func readSlices(path string) ([]discoveryv1.EndpointSlice, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []discoveryv1.EndpointSlice
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		js, err := yaml.ToJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		var tm metav1.TypeMeta
		if len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		if tm.Kind != "EndpointSlice" {
			continue
		}
		var sl discoveryv1.EndpointSlice
		if err := json.Unmarshal(js, &sl); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		out = append(out, sl)
	}
}

// iptablesSave returns the nat table of the node namespace, from the
// flavour that holds steelyard's rules.
func iptablesSave(sb *sandbox.Sandbox, mode string) (string, error) {
	cmds := []string{"iptables-save", "iptables-legacy-save"}
	switch mode {
	case "nft":
		cmds = []string{"iptables-nft-save"}
	case "legacy":
		cmds = []string{"iptables-legacy-save"}
	}
	var last error
	for _, c := range cmds {
		out, err := sb.Node.Exec(c, "-t", "nat")
		if err == nil && strings.Contains(out, "STEELYARD-") {
			return out, nil
		}
		if err != nil {
			last = err
		}
	}
	if last == nil {
		last = errors.New("no STEELYARD rules found")
	}
	return "", fmt.Errorf("iptables-save in the node namespace: %w", last)
}

var jumpRE = regexp.MustCompile(`-[jg] (STEELYARD-[A-Z]+-[A-Z0-9]+)`)

// excerpt returns the STEELYARD-SERVICES rules whose comment names service
// and every line of the Service and endpoint chains they lead to (the shared
// STEELYARD-MARK-MASQ chain left out).
func excerpt(save, service string) []string {
	lines := strings.Split(save, "\n")
	var out []string
	chains := map[string]bool{}
	var queue []string
	for _, l := range lines {
		if strings.HasPrefix(l, "-A STEELYARD-SERVICES ") && strings.Contains(l, `"`+service) {
			out = append(out, l)
			if m := jumpRE.FindStringSubmatch(l); m != nil && !chains[m[1]] {
				chains[m[1]] = true
				queue = append(queue, m[1])
			}
		}
	}
	for len(queue) > 0 {
		c := queue[0]
		queue = queue[1:]
		for _, l := range lines {
			if !strings.HasPrefix(l, "-A "+c+" ") {
				continue
			}
			out = append(out, l)
			for _, m := range jumpRE.FindAllStringSubmatch(l, -1) {
				if !chains[m[1]] && !strings.HasPrefix(m[1], "STEELYARD-MARK") {
					chains[m[1]] = true
					queue = append(queue, m[1])
				}
			}
		}
	}
	return out
}
