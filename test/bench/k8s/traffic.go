package main

// The traffic phase (-traffic-sizes): after a proxy's first full sync and
// before the endpoint changes, one extra Service gets two real backends,
// and a client on the node measures, through the VIP and direct to a pod
// address, in one run:
//
//   - first byte: connect + the server's first byte of -traffic-conns new
//     connections per path (p50, p99), VIP and direct alternating;
//   - requests/s with a new connection per request and with keepalive
//     connections, -traffic-duration per path and mode, each worker
//     alternating VIP and direct request by request (pairedRates).
//
// The backends are two pod namespaces of the sandbox (routed /32 veths,
// 198.19.0.21 and .22, outside the loaded endpoints' 198.19.1.0+), weighted
// 10/90 by steelyard.io/weights (kube-proxy ignores it: equal). The Service
// is created for the phase (after the first sync, so that sync counts the
// loaded set only) and deleted after it; the phase waits until the VIP no
// longer answers, then -settle, before the changes start.
//
// The client is a child process (trafficclient.go) in the proxy's network
// namespace; for a proxy that balances in the socket layer of one cgroup
// (--mode ebpf) the caller names that cgroup and the child is moved into
// it before it opens a socket.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The traffic Service and its two backends (IDs 'a' and 'b').
const (
	trafficService = "traffic"
	trafficWeightA = 10
	trafficWeightB = 90
)

var trafficBackends = [2]netip.Addr{netip.MustParseAddr("198.19.0.21"), netip.MustParseAddr("198.19.0.22")}

// trafficConfig holds the -traffic-* flags.
type trafficConfig struct {
	sizes    []int // nil: every size
	none     bool
	conns    int
	duration time.Duration
	workers  int
	limit    time.Duration
}

// registerTrafficFlags defines the -traffic-* flags on the default set.
func registerTrafficFlags(t *trafficConfig) {
	flag.Func("traffic-sizes", `Service counts at which to run the traffic phase (comma-separated), "all" (default) or "none"`, func(s string) error {
		var err error
		t.sizes, t.none, err = parseTrafficSizes(s)
		return err
	})
	flag.IntVar(&t.conns, "traffic-conns", 2000, "traffic phase: new connections per path (VIP, direct) for the first-byte latency")
	flag.DurationVar(&t.duration, "traffic-duration", 5*time.Second, "traffic phase: time per path and mode (new connection per request, keepalive) for requests/s")
	flag.IntVar(&t.workers, "traffic-workers", 2, "traffic phase: concurrent client loops for requests/s")
	flag.DurationVar(&t.limit, "traffic-timeout", 5*time.Minute, "traffic phase: limit for the whole phase of one proxy")
}

// parseTrafficSizes reads -traffic-sizes: "all" or "" (nil, false),
// "none" (nil, true), or a list of Service counts.
func parseTrafficSizes(s string) (sizes []int, none bool, err error) {
	switch strings.TrimSpace(s) {
	case "", "all":
		return nil, false, nil
	case "none":
		return nil, true, nil
	}
	sizes, err = parseInts(s)
	return sizes, false, err
}

// at reports whether the phase runs at n Services.
func (t trafficConfig) at(n int) bool {
	if t.none || t.conns < 1 || t.workers < 1 || t.duration <= 0 {
		return false
	}
	return t.sizes == nil || slices.Contains(t.sizes, n)
}

// trafficResult is one proxy's traffic phase.
type trafficResult struct {
	err      string // why the phase measured nothing (more)
	vip      string
	weighted bool // the proxy applies steelyard.io/weights
	out      trafficOutput
}

// runTraffic runs the phase for proxy p in sandbox s. cgroup, when not
// empty, is the cgroup v2 directory (as this process sees it) whose
// processes the proxy balances: the client is moved there.
func runTraffic(ctx context.Context, cfg *config, s *sandbox.Sandbox, w *world, m *monitor, p proxy, n int, cgroup string) *trafficResult {
	tr := &trafficResult{weighted: p.steelyard()}
	ctx, cancel := context.WithTimeout(ctx, cfg.traffic.limit)
	defer cancel()
	fail := func(format string, args ...any) *trafficResult {
		tr.err = fmt.Sprintf(format, args...)
		logf("N=%d: %s: traffic: %s", n, p.label(), tr.err)
		return tr
	}
	var servers []*backendServer
	defer func() {
		for _, b := range servers {
			b.close()
		}
	}()
	for i, ip := range trafficBackends {
		id := byte('a' + i)
		pod, err := s.AddPod(fmt.Sprintf("traffic-%c", id), ip)
		if err != nil {
			return fail("backend pod: %v", err)
		}
		var l net.Listener
		if err := pod.NS.Do(func() (err error) {
			l, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", endpointPort))
			return err
		}); err != nil {
			return fail("backend listener: %v", err)
		}
		servers = append(servers, serveBackend(l, id))
	}

	if err := trafficNodeSysctls(s.Node); err != nil {
		return fail("node sysctls: %v", err)
	}

	vip, err := createTrafficService(ctx, w)
	// Deleted whatever happened; then the VIP must stop answering (the
	// proxy has synced the deletion) before the changes start.
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), cfg.changeTimeout)
		defer cancel()
		if err := deleteTrafficService(dctx, w); err != nil {
			logf("N=%d: %s: traffic: deleting the Service: %v", n, p.label(), err)
			return
		}
		if err := waitVIPGone(dctx, s.Node, m, vip); err != nil {
			logf("N=%d: %s: traffic: after the Service's deletion: %v", n, p.label(), err)
		}
		sleep(ctx, cfg.settle)
	}()
	if err != nil {
		return fail("%v", err)
	}
	tr.vip = vip.String()
	job := trafficJob{
		VIP:      vip.String(),
		Direct:   netip.AddrPortFrom(trafficBackends[0], endpointPort).String(),
		Conns:    cfg.traffic.conns,
		Limit:    cfg.traffic.limit / 3,
		Duration: cfg.traffic.duration,
		Workers:  cfg.traffic.workers,
		Ready:    cfg.changeTimeout,
		Timeout:  2 * time.Second,
	}
	out, err := runTrafficClient(ctx, s.Node.Name, cgroup, job)
	tr.out = out
	if err != nil {
		return fail("client: %v", err)
	}
	if out.Error != "" {
		return fail("%s", out.Error)
	}
	logf("N=%d: %s: traffic: %s", n, p.label(), tr.summary())
	return tr
}

// waitVIPGone polls the VIP from the node namespace until a connection
// fails (no rule, map entry or socket-layer entry leads to a backend any
// more). Not the kernel's DNAT count: kube-proxy's iptables mode removes
// the Service's jump at once but keeps its endpoint chains until a full
// sync (hourly), so the count stays up while the VIP is gone. For the
// socket-layer mode the poll must come from a process in the agent's
// cgroup, as k8s-bench is in the ebpf run; from outside it, the VIP never
// answers and the wait ends at once.
func waitVIPGone(ctx context.Context, node *sandbox.NS, m *monitor, vip netip.AddrPort) error {
	for {
		if _, err := node.Dial("tcp", vip, 300*time.Millisecond); err != nil {
			return nil
		}
		if m != nil {
			if err := m.exited(); err != nil {
				return err
			}
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return fmt.Errorf("%s still answers: %w", vip, ctx.Err())
		}
	}
}

// createTrafficService creates the traffic Service and its slice and
// returns the VIP:port the API server gave it.
func createTrafficService(ctx context.Context, w *world) (netip.AddrPort, error) {
	svc, err := w.client.CoreV1().Services(benchNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: trafficService,
			Annotations: map[string]string{"steelyard.io/weights": fmt.Sprintf("%s=%d,%s=%d",
				trafficBackends[0], trafficWeightA, trafficBackends[1], trafficWeightB)},
		},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(endpointPort),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("create Service %s: %w", trafficService, err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("Service %s: ClusterIP %q: %w", trafficService, svc.Spec.ClusterIP, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: trafficService + "-1",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: trafficService,
				discoveryv1.LabelManagedBy:   managedBy,
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](endpointPort)}},
	}
	for _, ip := range trafficBackends {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	if _, err := w.client.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("create EndpointSlice %s: %w", slice.Name, err)
	}
	return netip.AddrPortFrom(vip, 80), nil
}

func deleteTrafficService(ctx context.Context, w *world) error {
	err1 := w.client.DiscoveryV1().EndpointSlices(benchNS).Delete(ctx, trafficService+"-1", metav1.DeleteOptions{})
	err2 := w.client.CoreV1().Services(benchNS).Delete(ctx, trafficService, metav1.DeleteOptions{})
	if err2 != nil {
		return err2
	}
	return err1
}

// runTrafficClient runs the client in namespace ns (and cgroup, if set)
// and returns what it measured.
func runTrafficClient(ctx context.Context, ns, cgroup string, job trafficJob) (trafficOutput, error) {
	var out trafficOutput
	argv, err := trafficClientArgv()
	if err != nil {
		return out, err
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, argv...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return out, err
	}
	if err := cmd.Start(); err != nil {
		return out, err
	}
	// ip netns exec execs the client: the PID is the client's. It waits
	// for the job, so it opens no socket before it is in the cgroup.
	if cgroup != "" {
		if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			return out, fmt.Errorf("moving the client into %s: %w", cgroup, err)
		}
	}
	if err := json.NewEncoder(stdin).Encode(job); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return out, err
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		if ctx.Err() != nil {
			return out, fmt.Errorf("timeout (> the phase's limit): %w", ctx.Err())
		}
		return out, fmt.Errorf("%w: %s", err, lastLines(stderr.String(), 5))
	}
	return parseTrafficOutput(stdout.Bytes())
}

// trafficNodeSysctls lets the client in the node namespace open new
// connections at any rate for the phase's seconds: it closes first, so each
// connection leaves a TIME_WAIT on its port; tcp_tw_reuse=1 reuses such a
// port for a new connection a second later, and the wide range gives
// 32,000 ports of each parity (connect prefers one). Both paths alike;
// the settings are the namespace's own.
func trafficNodeSysctls(ns *sandbox.NS) error {
	for k, v := range map[string]string{"net/ipv4/tcp_tw_reuse": "1", "net/ipv4/ip_local_port_range": "1024 65535"} {
		if err := ns.WriteSysctl(k, v); err != nil {
			return err
		}
	}
	return nil
}

// trafficClientArgv is the client's command: this binary, as
// traffic-client (a test binary runs a helper test instead).
var trafficClientArgv = func() ([]string, error) {
	exe, err := os.Executable()
	return []string{exe, trafficClientCmd}, err
}

// parseTrafficOutput decodes the client's output: exactly one JSON object.
func parseTrafficOutput(b []byte) (trafficOutput, error) {
	var out trafficOutput
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return out, fmt.Errorf("client output: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return out, fmt.Errorf("client output: more than one object")
	}
	return out, nil
}

// Summaries.

// seconds turns a sample list into durations (for percentile).
func seconds(s []float64) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, v := range s {
		out[i] = time.Duration(v * float64(time.Second))
	}
	return out
}

// firstByte is the p-quantile of one path's first-byte samples; ok is
// false without samples.
func (t *trafficResult) firstByte(direct bool, q float64) (time.Duration, bool) {
	if t == nil {
		return 0, false
	}
	s := t.out.FirstVIP
	if direct {
		s = t.out.FirstDirect
	}
	if len(s) == 0 {
		return 0, false
	}
	return percentile(seconds(s), q), true
}

// measured reports whether both paths have first-byte samples and rates.
func (t *trafficResult) measured() bool {
	return t != nil && t.err == "" && len(t.out.FirstVIP) > 0 && len(t.out.FirstDirect) > 0 &&
		t.out.NewVIP.Seconds > 0 && t.out.NewDirect.Seconds > 0
}

// shareA is backend a's share of the VIP's new connections, in percent,
// and the count it is taken over.
func (t *trafficResult) shareA() (float64, int) {
	total := 0
	for _, k := range t.out.IDs {
		total += k
	}
	if total == 0 {
		return 0, 0
	}
	return 100 * float64(t.out.IDs["a"]) / float64(total), total
}

// wantShareA is backend a's configured share in percent.
func (t *trafficResult) wantShareA() float64 {
	if t.weighted {
		return 100 * float64(trafficWeightA) / float64(trafficWeightA+trafficWeightB)
	}
	return 50
}

func (t *trafficResult) summary() string {
	v50, _ := t.firstByte(false, 0.5)
	d50, _ := t.firstByte(true, 0.5)
	share, total := t.shareA()
	o := t.out
	return fmt.Sprintf("first byte p50 %v VIP / %v direct; new-connection req/s %.0f / %.0f (slowest %.3f / %.3f s, %d / %d over %v); keepalive %.0f / %.0f; backend a %.1f%% of %d (want %.0f%%); cgroup %s",
		v50.Round(time.Microsecond), d50.Round(time.Microsecond), o.NewVIP.perSecond(), o.NewDirect.perSecond(),
		o.NewVIP.MaxSeconds, o.NewDirect.MaxSeconds, o.NewVIP.Slow, o.NewDirect.Slow, slowRequest,
		o.KeepVIP.perSecond(), o.KeepDirect.perSecond(), share, total, t.wantShareA(), o.Cgroup)
}

// fill adds the phase's figures to the proxy's point.
func (t *trafficResult) fill(p *point.Result) {
	if !t.measured() {
		return
	}
	p.FirstPacketP50, _ = secondsOf(t.firstByte(false, 0.5))
	p.FirstPacketP99, _ = secondsOf(t.firstByte(false, 0.99))
	p.DirectFirstPacketP50, _ = secondsOf(t.firstByte(true, 0.5))
	p.DirectFirstPacketP99, _ = secondsOf(t.firstByte(true, 0.99))
	p.RPSNewVIP = t.out.NewVIP.perSecond()
	p.RPSNewDirect = t.out.NewDirect.perSecond()
	p.RPSKeepaliveVIP = t.out.KeepVIP.perSecond()
	p.RPSKeepaliveDirect = t.out.KeepDirect.perSecond()
}

func secondsOf(d time.Duration, ok bool) (float64, bool) { return d.Seconds(), ok }

// printTraffic prints the traffic table and the goals' ratios under the
// main table; nothing when no proxy ran the phase.
func printTraffic(out io.Writer, results []result) {
	var rows []result
	for _, r := range results {
		if r.traffic != nil {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(out, "\ntraffic: a client on the node, one Service with two backends (pods %s, %s), VIP vs direct to %s\n",
		trafficBackends[0], trafficBackends[1], trafficBackends[0])
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "proxy\tServices\tfirst byte p50 / p99 VIP\tdirect\tnew conn req/s VIP / direct\tkeepalive req/s VIP / direct\tbackend a via VIP (want)\terrors\t")
	for _, r := range rows {
		t := r.traffic
		name := r.proxy.label()
		if r.proxy.flavour != "" {
			name += " " + r.proxy.flavour
		}
		if !t.measured() {
			fmt.Fprintf(w, "%s\t%d\tfailed: %s\t\t\t\t\t\t\n", name, r.services, t.err)
			continue
		}
		v50, _ := t.firstByte(false, 0.5)
		v99, _ := t.firstByte(false, 0.99)
		d50, _ := t.firstByte(true, 0.5)
		d99, _ := t.firstByte(true, 0.99)
		share, total := t.shareA()
		tol := sandbox.ShareTolerance(t.wantShareA(), total, 4)
		o := t.out
		errs := o.FirstVIPErrors + o.FirstDirErrors + o.NewVIP.Errors + o.NewDirect.Errors + o.KeepVIP.Errors + o.KeepDirect.Errors
		fmt.Fprintf(w, "%s\t%d\t%s / %s\t%s / %s\t%.0f / %.0f (%.2fx)\t%.0f / %.0f (%.2fx)\t%.1f%% of %d (%.0f ± %.1f)\t%d\t\n",
			name, r.services, fmtMicros(v50), fmtMicros(v99), fmtMicros(d50), fmtMicros(d99),
			o.NewVIP.perSecond(), o.NewDirect.perSecond(), ratio(o.NewVIP.perSecond(), o.NewDirect.perSecond()),
			o.KeepVIP.perSecond(), o.KeepDirect.perSecond(), ratio(o.KeepVIP.perSecond(), o.KeepDirect.perSecond()),
			share, total, t.wantShareA(), tol, errs)
	}
	w.Flush()
	for _, l := range trafficGoals(rows) {
		fmt.Fprintln(out, l)
	}
	fmt.Fprintf(out, `first byte: connect + the server's first byte of each new connection, VIP and direct alternating.
req/s: a new connection per request (connect, first byte, one request and answer, close) and keepalive
  (one connection per path and worker, one-byte request and answer); each worker alternates VIP and direct
  request by request, a path's req/s = its requests / (the time they took / workers).
`)
}

// trafficGoals are the traffic goals as ratios within the run: the
// ebpf mode's first-byte p50 over steelyard nftables' at the same size
// (goal <= 0.7) and, per proxy, new-connection req/s through the VIP over
// direct (goal >= 0.98).
func trafficGoals(rows []result) []string {
	var out []string
	for _, r := range rows {
		if !r.traffic.measured() {
			continue
		}
		o := r.traffic.out
		out = append(out, fmt.Sprintf("N=%d, %s: new-connection req/s VIP / direct %.2fx (goal >= 0.98); first byte p50 VIP / direct %.2fx",
			r.services, r.proxy.label(), ratio(o.NewVIP.perSecond(), o.NewDirect.perSecond()),
			ratio(percentile(seconds(o.FirstVIP), 0.5).Seconds(), percentile(seconds(o.FirstDirect), 0.5).Seconds())))
	}
	for _, e := range rows {
		if e.proxy.name != "steelyard-ebpf" || !e.traffic.measured() {
			continue
		}
		for _, nf := range rows {
			if nf.proxy.name == proxySteelyardNFTables && nf.services == e.services && nf.traffic.measured() {
				a, _ := e.traffic.firstByte(false, 0.5)
				b, _ := nf.traffic.firstByte(false, 0.5)
				out = append(out, fmt.Sprintf("N=%d, steelyard ebpf / steelyard nftables: first byte p50 through the VIP %.2fx (goal <= 0.7)",
					e.services, ratio(a.Seconds(), b.Seconds())))
			}
		}
	}
	return out
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func fmtMicros(d time.Duration) string {
	return fmt.Sprintf("%dµs", d.Microseconds())
}
