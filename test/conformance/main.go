// Command conformance runs Kubernetes' own e2e Service tests (e2e.test
// v1.37.2 through ginkgo) on the real node of test/node/cluster, once per
// proxy, prints one table and writes each proxy's summary to
// docs/conformance/<proxy>.json (`make conformance`, docs/conformance.md):
//
//	steelyard-iptables   steelyard from manifests/, MODE=iptables
//	steelyard-nftables   steelyard from manifests/, MODE=nftables
//	steelyard-ebpf       steelyard from the chart, mode ebpf, each node's
//	                     own cgroup and bpffs (ebpf.go); not in the
//	                     default list until it has run
//	kube-proxy           kube-proxy v1.37.2, iptables mode, a process in
//	                     each node's namespaces (a reference)
//	kube-proxy-nftables  the same in nftables mode (a reference)
//
// Each proxy gets a fresh cluster of --nodes nodes (test/node/cluster;
// with more than one, a node LAN, zones a/b/c and both IP families). The suite runs in a
// client namespace on the node LAN ("outside the nodes", like the host of
// a kind cluster), with --provider=local and a kubeconfig for the API
// server's address on the first node. Focus and skip come from skip.txt,
// one reason per rule.
//
// It exits non-zero when a proxy's run did not complete, or when a
// selected spec failed, was interrupted or never ran for a steelyard
// proxy; kube-proxy's failures are reported, not fatal (it is the
// reference, in either mode).
package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/steelyard-net/steelyard/test/node/cluster"
	"github.com/steelyard-net/steelyard/test/runinfo"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// proxies are the dataplanes the runner knows, in table order.
var proxies = []string{"steelyard-iptables", "steelyard-nftables", ebpfProxy, "kube-proxy", "kube-proxy-nftables"}

// defaultProxies are the ones a run without --proxies runs: not
// steelyard-ebpf yet, which has not run on this cluster (docs/conformance.md;
// --proxies=steelyard-ebpf runs it).
var defaultProxies = []string{"steelyard-iptables", "steelyard-nftables", "kube-proxy", "kube-proxy-nftables"}

// extraControllers are the kube-controller-manager controllers the suite
// needs beyond the node's own set: the Service tests create their
// backends as ReplicationControllers and Jobs and read Endpoints.
// service-cidr-controller marks a new ServiceCIDR ready ("Service CIDRs
// should create Services and serve on different Service CIDRs").
var extraControllers = []string{"replicationcontroller-controller", "endpoints-controller", "job-controller", "disruption-controller", "service-cidr-controller"}

type config struct {
	imagesDir,
	e2eDir, skipFile, manifests, out, focus, summaryDir string
	// chart and chartBin render the chart for steelyard-ebpf
	// (steelyard-chart template).
	chart, chartBin string
	proxies         []string
	// nodes is the number of Kubernetes nodes, procs ginkgo's parallel
	// processes (its own --nodes).
	nodes, procs int
	timeout      time.Duration
	parallel     bool
}

func main() {
	var cfg config
	var list string
	flag.StringVar(&cfg.e2eDir, "e2e-dir", "", "directory with e2e.test and ginkgo (scripts/conformance/build.sh)")
	flag.StringVar(&cfg.imagesDir, "images-dir", "", "directory with agnhost-e2e.tar and coredns.tar (scripts/conformance/images.sh)")
	flag.StringVar(&cfg.skipFile, "skip-file", "test/conformance/skip.txt", "focus and skip rules")
	flag.StringVar(&cfg.manifests, "manifests", "manifests", "steelyard's manifests/")
	flag.StringVar(&cfg.out, "out", "", "results directory (default /tmp/steelyard-conformance-<pid>)")
	flag.StringVar(&cfg.focus, "focus", "", "regexp replacing skip.txt's focus lines (a narrow run); its skip lines still apply")
	flag.StringVar(&cfg.chart, "chart", "charts/steelyard", "steelyard's chart (steelyard-ebpf)")
	flag.StringVar(&cfg.chartBin, "chart-bin", "bin/steelyard-chart", "steelyard-chart (make chart-tool), which renders the chart for steelyard-ebpf")
	flag.StringVar(&list, "proxies", strings.Join(defaultProxies, ","), "comma-separated, from: "+strings.Join(proxies, ", "))
	flag.IntVar(&cfg.nodes, "nodes", 3, "Kubernetes nodes per proxy's cluster (the multi-node and zone specs need 2 and 3)")
	flag.IntVar(&cfg.procs, "ginkgo-nodes", 4, "ginkgo's parallel processes (ginkgo calls them nodes)")
	flag.BoolVar(&cfg.parallel, "parallel", false, "run the proxies at the same time, a node each (faster; wall times then include the contention)")
	flag.DurationVar(&cfg.timeout, "timeout", 90*time.Minute, "ginkgo's timeout per proxy")
	flag.StringVar(&cfg.summaryDir, "summary-dir", "", "where each proxy's summary (<proxy>.json) is written (default docs/conformance, the committed record; with --focus, the results directory)")
	report := flag.String("report", "", "print the table of an earlier run's results directory and exit")
	flag.Parse()
	if *report != "" {
		if err := rerender(*report, cfg); err != nil {
			log.Fatalf("conformance: %v", err)
		}
		return
	}
	var err error
	if cfg.proxies, err = parseProxies(list); err != nil {
		log.Fatalf("conformance: %v", err)
	}
	if cfg.out == "" {
		cfg.out = fmt.Sprintf("/tmp/steelyard-conformance-%d", os.Getpid())
	}
	if cfg.summaryDir == "" {
		// A narrow run must not replace the committed record of a full one.
		cfg.summaryDir = "docs/conformance"
		if cfg.focus != "" {
			cfg.summaryDir = cfg.out
		}
	}
	if err := run(cfg); err != nil {
		log.Fatalf("conformance: %v", err)
	}
}

// parseProxies reads --proxies: known names, comma-separated, in the
// order given; empty means defaultProxies.
func parseProxies(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return slices.Clone(defaultProxies), nil
	}
	var out []string
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(proxies, p) {
			return nil, fmt.Errorf("unknown proxy %q (want %s)", p, strings.Join(proxies, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

func run(cfg config) error {
	// The tree the images are built from, read before the run: the
	// checkout may move during a run of twenty minutes or more.
	commit := runinfo.Commit()
	if cfg.e2eDir == "" || cfg.imagesDir == "" {
		return errors.New("--e2e-dir and --images-dir are required (scripts/conformance/build.sh and images.sh print them)")
	}
	f, err := os.Open(cfg.skipFile)
	if err != nil {
		return err
	}
	rules, err := ParseList(f)
	f.Close()
	if err != nil {
		return err
	}
	if cfg.focus != "" {
		re, err := regexp.Compile(cfg.focus)
		if err != nil {
			return fmt.Errorf("--focus: %w", err)
		}
		rules.Focus = []Rule{{Regex: re, Reason: "--focus"}}
	}
	rules = familyRules(rules, dualStack(cfg.nodes))
	for _, p := range []*string{&cfg.manifests, &cfg.chart, &cfg.chartBin} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if slices.Contains(cfg.proxies, ebpfProxy) {
		if _, err := os.Stat(cfg.chartBin); err != nil {
			return fmt.Errorf("%s needs steelyard-chart (make chart-tool): %w", ebpfProxy, err)
		}
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	e2e, ginkgo := filepath.Join(cfg.e2eDir, "e2e.test"), filepath.Join(cfg.e2eDir, "ginkgo")
	if err := checkImages(e2e); err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			log.Printf("conformance: interrupted, tearing down")
		case <-finished:
		}
	}()
	defer sandbox.CloseAll()
	defer cluster.StopAll()

	results := make([]result, len(cfg.proxies))
	one := func(i int) {
		p := cfg.proxies[i]
		if ctx.Err() != nil {
			results[i] = result{proxy: p, err: ctx.Err()}
			return
		}
		r, err := runProxy(ctx, cfg, rules, p, e2e, ginkgo)
		if err != nil {
			log.Printf("conformance: %s: %v", p, err)
			r.err = err
		}
		results[i] = r
		// Printed as each run ends too: a later one may be interrupted.
		log.Printf("conformance: %s: %d passed, %d failed, %d skipped in %v", p, len(r.Passed), len(r.Failed), len(r.Skipped), r.wall.Round(time.Second))
	}
	var wg sync.WaitGroup
	for i := range cfg.proxies {
		if !cfg.parallel {
			one(i)
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); one(i) }()
	}
	wg.Wait()
	table := render(results, rules, e2e, ginkgo, cfg.nodes)
	fmt.Print(table)
	_ = os.WriteFile(filepath.Join(cfg.out, "table.txt"), []byte(table), 0o644)
	run := Summary{
		Commit: commit, Date: runinfo.Date(), LoadAvg: runinfo.LoadAvg(),
		E2E: version(e2e, "--version"), Ginkgo: version(ginkgo, "version"),
		Nodes: cfg.nodes, DualStack: dualStack(cfg.nodes), Processes: cfg.procs, Focus: cfg.focus,
	}
	for _, r := range results {
		if r.err != nil {
			continue // no complete report: nothing to commit
		}
		p, err := writeSummary(cfg.summaryDir, summarize(r, rules, run))
		if err != nil {
			return err
		}
		log.Printf("conformance: %s: summary %s (make docs renders the tables from it)", r.proxy, p)
	}
	if why := verdict(results); why != "" {
		return errors.New(why)
	}
	return nil
}

// rerender prints the table of the JUnit reports under dir/<proxy>/.
func rerender(dir string, cfg config) error {
	f, err := os.Open(cfg.skipFile)
	if err != nil {
		return err
	}
	rules, err := ParseList(f)
	f.Close()
	if err != nil {
		return err
	}
	rules = familyRules(rules, dualStack(cfg.nodes))
	var results []result
	for _, p := range proxies {
		jf, err := os.Open(filepath.Join(dir, p, "junit.xml"))
		if err != nil {
			continue
		}
		o, err := ParseJUnit(jf)
		jf.Close()
		if err != nil {
			return err
		}
		o.Classify(rules)
		r := result{Outcome: o, proxy: p, wall: time.Duration(o.Seconds * float64(time.Second))}
		if b, err := os.ReadFile(filepath.Join(dir, p, "wall.txt")); err == nil {
			if d, err := time.ParseDuration(strings.TrimSpace(string(b))); err == nil {
				r.wall = d
			}
		}
		results = append(results, r)
	}
	if len(results) == 0 {
		return fmt.Errorf("no junit.xml under %s/<proxy>/", dir)
	}
	e2e, ginkgo := filepath.Join(cfg.e2eDir, "e2e.test"), filepath.Join(cfg.e2eDir, "ginkgo")
	fmt.Print(render(results, rules, e2e, ginkgo, cfg.nodes))
	return nil
}

// result is one proxy's run.
type result struct {
	Outcome
	proxy string
	wall  time.Duration
	err   error
}

// steelyardArgs are added to the agent's flags from manifests/: the opt-in
// kube-proxy compatible endpoints at kube-proxy's own addresses, which
// steelyard serves where it replaces kube-proxy: the metrics one (the
// KubeProxy metric test reads /proxyMode and the localhost node port
// counter) and the health one ("should check kube-proxy urls" reads
// 10256/healthz). They are the only flags the run adds.
var steelyardArgs = []string{"--kube-proxy-metrics-bind-address=127.0.0.1:10249", "--kube-proxy-healthz-bind-address=0.0.0.0:10256"}

func runProxy(ctx context.Context, cfg config, rules List, proxy, e2e, ginkgo string) (result, error) {
	r := result{proxy: proxy}
	dir := filepath.Join(cfg.out, proxy)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, err
	}
	log.Printf("conformance: %s: starting %d node(s)", proxy, cfg.nodes)
	c, err := cluster.Start(ctx, cluster.Options{
		Nodes: cfg.nodes,
		// Several clusters may start at once (--parallel) on a loaded
		// machine.
		ReadyTimeout:     5 * time.Minute,
		Logf:             log.Printf,
		ExtraControllers: extraControllers,
		ExtraImages:      extraImages(cfg.imagesDir),
		ClusterDNS:       clusterDNS,
		// steelyard's install-cni chains steelyard-cni, which turns
		// hairpin mode on; kube-proxy's nodes get it from the bridge.
		BridgeHairpin: !isSteelyard(proxy),
		DualStack:     dualStack(cfg.nodes),
	})
	if err != nil {
		return r, err
	}
	defer func() {
		saveLogs(ctx, c, dir)
		if err := c.Stop(); err != nil {
			log.Printf("conformance: %s: teardown: %v", proxy, err)
		}
	}()
	switch proxy {
	case "steelyard-iptables":
		err = c.Install(ctx, []string{cfg.manifests}, map[string]string{"MODE": "iptables"}, steelyardArgs...)
	case "steelyard-nftables":
		err = c.Install(ctx, []string{cfg.manifests}, map[string]string{"MODE": "nftables"}, steelyardArgs...)
	case ebpfProxy:
		chart := filepath.Join(dir, "chart")
		if err = renderEBPF(ctx, cfg, c, chart); err == nil {
			err = c.Install(ctx, []string{chart}, nil, steelyardArgs...)
		}
		if err == nil {
			err = checkEBPF(ctx, c, dir)
		}
	case "kube-proxy":
		err = c.StartKubeProxy(ctx, "iptables")
	case "kube-proxy-nftables":
		err = c.StartKubeProxy(ctx, "nftables")
	}
	if err != nil {
		return r, fmt.Errorf("installing the proxy: %w", err)
	}
	if err := installDNS(ctx, c, dir); err != nil {
		return r, fmt.Errorf("cluster DNS: %w", err)
	}
	runner, err := runnerNS(c)
	if err != nil {
		return r, err
	}
	kubeconfig, err := nodeKubeconfig(c, dir)
	if err != nil {
		return r, err
	}
	args := append([]string{"--net=" + runner.Path(), "--", ginkgo,
		fmt.Sprintf("--nodes=%d", cfg.procs),
		"--timeout=" + cfg.timeout.String(),
		"--junit-report=junit.xml", "--output-dir=" + dir,
		"--no-color", "--silence-skips", "--poll-progress-after=5m",
	}, rules.GinkgoArgs()...)
	args = append(args, e2e, "--",
		"--provider=local",
		"--kubeconfig="+kubeconfig,
		"--kubectl-path="+c.CP.Binaries.Kubectl,
		"--report-dir="+dir,
		"--dump-logs-on-failure=false",
		"--allowed-not-ready-nodes=0",
		// e2e.test counts the nodes only in ginkgo's first process; the
		// others keep -1 and every "Requires at least 2 nodes" spec they
		// run skips itself (as upstream's hack/ginkgo-e2e.sh, give it).
		fmt.Sprintf("--num-nodes=%d", cfg.nodes),
	)
	logPath := filepath.Join(dir, "ginkgo.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return r, err
	}
	defer lf.Close()
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Dir = dir
	// ginkgo's parallel e2e.test processes share its process group:
	// an interrupt ends them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 30 * time.Second
	log.Printf("conformance: %s: running e2e.test (%d processes, %d node(s); log %s)", proxy, cfg.procs, cfg.nodes, logPath)
	t0 := time.Now()
	runErr := cmd.Run()
	r.wall = time.Since(t0)
	jf, err := os.Open(filepath.Join(dir, "junit.xml"))
	if err != nil {
		return r, fmt.Errorf("ginkgo: %v; no JUnit report (%v); see %s", runErr, err, logPath)
	}
	defer jf.Close()
	if r.Outcome, err = ParseJUnit(jf); err != nil {
		return r, err
	}
	r.Classify(rules)
	_ = os.WriteFile(filepath.Join(dir, "wall.txt"), []byte(r.wall.String()+"\n"), 0o644)
	// ginkgo exits non-zero when a spec fails: that is a result, not an
	// error of the harness.
	if runErr != nil && len(r.Failed) == 0 && len(r.Interrupted) == 0 && r.NotRun == 0 {
		return r, fmt.Errorf("ginkgo: %v; see %s", runErr, logPath)
	}
	return r, nil
}

// The images scripts/conformance/images.sh builds besides agnhost, by the
// names e2e.test gives them.
const (
	busyboxImage    = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	regressionImage = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"
	iptablesImage   = "registry.k8s.io/build-image/distroless-iptables:v0.9.9"
)

// extraImages are the tarballs of scripts/conformance/images.sh that every
// node imports.
func extraImages(dir string) []string {
	var out []string
	for _, f := range []string{"agnhost-e2e.tar", "busybox.tar", "coredns.tar", "regression-74839.tar", "distroless-iptables.tar"} {
		out = append(out, filepath.Join(dir, f))
	}
	return out
}

// clusterDNS is kube-dns's ClusterIP in coredns.yaml.
var clusterDNS = netip.MustParseAddr("198.18.0.10")

//go:embed coredns.yaml
var corednsYAML []byte

// installDNS runs CoreDNS as kube-dns (the Service tests reach Services
// by name) and waits for it: it answers only once the proxy serves the
// kubernetes Service, its way to the API server.
func installDNS(ctx context.Context, c *cluster.Cluster, dir string) error {
	f := filepath.Join(dir, "coredns.yaml")
	if err := os.WriteFile(f, corednsYAML, 0o644); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-f", f); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "deploy/coredns", "--timeout=3m")
	return err
}

// runnerNS is where ginkgo runs: the sandbox's client of a one-node
// cluster (its default route is the node), or a client on the node LAN of
// several, with a route to each node's pod ranges (both families) via
// that node, as the lan namespace has them (a kind cluster's host reaches
// node addresses and, routed, pod IPs; never the Service range).
func runnerNS(c *cluster.Cluster) (*sandbox.NS, error) {
	if c.LAN == nil {
		return c.Sandbox.AddClient(netipZero)
	}
	ns, err := c.AddLANClient()
	if err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if err := ns.IPBatch(fmt.Sprintf("route add %s via %s dev eth0", n.PodCIDR, n.IP)); err != nil {
			return nil, err
		}
		if n.PodCIDR6.IsValid() {
			if err := ns.IPBatch(fmt.Sprintf("route add %s via %s dev eth0", n.PodCIDR6, n.IP6)); err != nil {
				return nil, err
			}
		}
	}
	return ns, nil
}

// nodeKubeconfig writes the admin's kubeconfig with the API server at the
// first node's address (relayed there, and named in its certificate):
// the runner's namespace has no 127.0.0.1 of the root namespace.
func nodeKubeconfig(c *cluster.Cluster, dir string) (string, error) {
	b, err := os.ReadFile(c.CP.Kubeconfig)
	if err != nil {
		return "", err
	}
	from := fmt.Sprintf("https://127.0.0.1:%d", c.APIPort)
	if !bytes.Contains(b, []byte(from)) {
		return "", fmt.Errorf("kubeconfig %s does not name %s", c.CP.Kubeconfig, from)
	}
	b = bytes.ReplaceAll(b, []byte(from), []byte(fmt.Sprintf("https://%s:%d", c.NodeIP, c.APIPort)))
	p := filepath.Join(dir, "kubeconfig")
	return p, os.WriteFile(p, b, 0o600)
}

// saveLogs keeps what explains a failure: the proxy's log on each node
// (steelyard-<node>.log, kube-proxy-<node>.log) and the components'
// tails.
func saveLogs(ctx context.Context, c *cluster.Cluster, dir string) {
	pods, _ := c.Kubectl(ctx, "-n", "steelyard", "get", "pods", "-l", "app.kubernetes.io/name=steelyard",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{"\n"}{end}`)
	for _, l := range strings.Split(strings.TrimSpace(pods), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if out, err := c.Kubectl(ctx, "-n", "steelyard", "logs", f[0], "-c", "steelyard", "--tail=5000"); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "steelyard-"+f[1]+".log"), []byte(out), 0o644)
		}
		// A restarted agent's log starts at its restart: keep the
		// previous container's, which says why it ended.
		if out, err := c.Kubectl(ctx, "-n", "steelyard", "logs", f[0], "-c", "steelyard", "--previous", "--tail=5000"); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "steelyard-"+f[1]+".previous.log"), []byte(out), 0o644)
		}
	}
	// Restarts and how the last container ended, per pod.
	if out, err := c.Kubectl(ctx, "-n", "steelyard", "get", "pods", "-o",
		`jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name} restarts={.status.containerStatuses[?(@.name=="steelyard")].restartCount} last={.status.containerStatuses[?(@.name=="steelyard")].lastState.terminated}{"\n"}{end}`); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "restarts.txt"), []byte(out), 0o644)
	}
	for _, n := range c.Nodes {
		if b, err := os.ReadFile(filepath.Join(n.Dir, "kube-proxy.log")); err == nil {
			_ = os.WriteFile(filepath.Join(dir, "kube-proxy-"+n.Name+".log"), b, 0o644)
		}
	}
	_ = os.WriteFile(filepath.Join(dir, "components.log"), []byte(c.Logs(200)), 0o644)
}

// checkImages lists the images e2e.test wants and checks that the node
// has the ones the Service tests use (pause, agnhost, busybox,
// regression-issue-74839 and distroless-iptables at the versions e2e.test
// names); the others are reported, not built: a test that needs
// one fails with an image pull error, which the table shows.
func checkImages(e2e string) error {
	out, err := exec.Command(e2e, "--list-images").Output()
	if err != nil {
		return fmt.Errorf("%s --list-images: %w", e2e, err)
	}
	want := map[string]bool{cluster.AgnhostImage: false, cluster.PauseImage: false, busyboxImage: false, regressionImage: false, iptablesImage: false}
	n := 0
	for _, l := range strings.Fields(string(out)) {
		n++
		if _, ok := want[l]; ok {
			want[l] = true
		}
	}
	for img, listed := range want {
		if !listed {
			return fmt.Errorf("e2e.test --list-images does not name %s: the node's images (scripts/node/images.sh) and e2e.test disagree on versions", img)
		}
	}
	log.Printf("conformance: e2e.test lists %d images; the nodes import %s, %s, %s, %s and %s (what the Service tests run)", n, cluster.AgnhostImage, busyboxImage, regressionImage, iptablesImage, cluster.PauseImage)
	return nil
}

func render(results []result, rules List, e2e, ginkgo string, nodes int) string {
	var b strings.Builder
	family := "IPv4 only"
	if dualStack(nodes) {
		family = "dual-stack IPv4/IPv6"
	}
	fmt.Fprintf(&b, "\nKubernetes e2e Service tests, %s, e2e.test %s, ginkgo %s, %d node(s), %s\n", time.Now().UTC().Format("2006-01-02"), version(e2e, "--version"), version(ginkgo, "version"), nodes, family)
	fmt.Fprintf(&b, "focus: %d rules, skip: %d rules (%s)\n\n", len(rules.Focus), len(rules.Skip), "test/conformance/skip.txt")
	fmt.Fprintf(&b, "| proxy | passed | failed | skipped by the test | filtered by skip.txt | not run (time-boxed) | wall time |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		wall := r.wall.Round(time.Second).String()
		if r.err != nil {
			wall += " (" + firstLine(r.err.Error()) + ")"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s |\n", r.proxy, len(r.Passed), len(r.Failed), len(r.Skipped), len(r.SkipListed), len(r.Interrupted)+r.NotRun, wall)
	}
	why := map[string]int{}
	for _, r := range results {
		for _, w := range r.Skipped {
			why[w]++
		}
	}
	if len(why) > 0 {
		fmt.Fprintf(&b, "\nskipped by the tests themselves (all proxies):\n")
		var ws []string
		for w := range why {
			ws = append(ws, w)
		}
		sort.Strings(ws)
		for _, w := range ws {
			fmt.Fprintf(&b, "  %d x %s\n", why[w], w)
		}
	}
	rule := map[string]int{}
	for _, r := range results {
		for _, w := range r.SkipListed {
			rule[w]++
		}
	}
	if len(rule) > 0 {
		fmt.Fprintf(&b, "\nfiltered by skip.txt (all proxies):\n")
		var ws []string
		for w := range rule {
			ws = append(ws, w)
		}
		sort.Strings(ws)
		for _, w := range ws {
			fmt.Fprintf(&b, "  %d x %s\n", rule[w], w)
		}
	}
	// The reference: what kube-proxy passed, in either mode.
	passed := map[string]bool{}
	haveRef := false
	for _, r := range results {
		if !isSteelyard(r.proxy) && r.err == nil {
			haveRef = true
			for _, n := range r.Passed {
				passed[n] = true
			}
		}
	}
	for _, r := range results {
		if len(r.Failed) > 0 {
			fmt.Fprintf(&b, "\n%s failed:\n", r.proxy)
			for _, n := range r.Failed {
				fmt.Fprintf(&b, "  %s\n      %s\n", n, firstLine(r.Messages[n]))
			}
		}
	}
	if haveRef {
		for _, r := range results {
			if !isSteelyard(r.proxy) {
				continue
			}
			var worse []string
			for _, n := range r.Failed {
				if passed[n] {
					worse = append(worse, n)
				}
			}
			sort.Strings(worse)
			fmt.Fprintf(&b, "\nfailed for %s, passed for kube-proxy (either mode): %d\n", r.proxy, len(worse))
			for _, n := range worse {
				fmt.Fprintf(&b, "  %s\n", n)
			}
		}
	}
	return b.String()
}

func version(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(firstLine(string(out)))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// netipZero lets AddClient pick the next free client address.
var netipZero netip.Addr
