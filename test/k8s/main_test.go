//go:build k8s

package k8s

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// steelyardBin is the agent binary under test.
var steelyardBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	bin, cleanup, err := sandbox.AgentBinary("k8s")
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8s:", err)
		return 1
	}
	defer cleanup()
	steelyardBin = bin
	if m := os.Getenv("STEELYARD_MODE"); m != "" {
		agentMode = m
	}
	fmt.Fprintf(os.Stderr, "k8s: every agent and CLI command runs with --mode %s (STEELYARD_MODE)\n", agentMode)
	if out, err := exec.Command(steelyardBin, "version").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "k8s: %s version: %v\n%s", steelyardBin, err, out)
		return 1
	}
	stop := sandbox.CloseOnSignal()
	defer stop()
	return m.Run()
}

// agentMode is the dataplane mode (--mode) of every agent and CLI command
// of the suite: $STEELYARD_MODE, iptables by default. `make k8s` runs the
// suite once per mode.
var agentMode = "iptables"

// Names shared by the tests.
const (
	testNS      = "k8s"
	managedBy   = "steelyard-test"
	nodeName    = "node1"
	weightsKey  = "steelyard.io/weights"
	podPort     = 8080
	servicePort = 80
	// The agent's servers, on the node namespace's loopback.
	metricsAddr = "127.0.0.1:10279"
	healthzAddr = "127.0.0.1:10276"
)

// env is one test's world: a control plane, a sandbox whose node namespace
// reaches the API server through a relay, a client namespace, pods, and the
// agent.
type env struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	admin  kubernetes.Interface
	sb     *sandbox.Sandbox
	client *sandbox.NS
	agent  *sandbox.Agent

	// relayAddr is where the relay to the API server listens in the node
	// namespace, and stopRelay stops it (nil when stopped).
	relayAddr netip.AddrPort
	stopRelay func()
}

// newEnv starts a control plane and a sandbox with one client, relays
// 127.0.0.1:<API server port> of the node namespace to the API server, and
// creates the test namespace.
func newEnv(t *testing.T, opts ...controlplane.Option) *env {
	t.Helper()
	sandbox.RequireRoot(t)
	cp := controlplane.Start(t, opts...)
	sb := sandbox.NewT(t, sandbox.Options{})
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	listen, err := netip.ParseAddrPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, cp: cp, admin: cp.Client(), sb: sb, relayAddr: listen}
	e.startRelay()
	// Runs before the sandbox's own cleanup (LIFO): the agents stop while
	// they can still reach the API server, and their logs stay readable.
	t.Cleanup(func() {
		for _, a := range sb.Agents() {
			_ = a.Stop()
		}
		if e.stopRelay != nil {
			e.stopRelay()
		}
	})
	if e.client, err = sb.AddClient(netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: testNS},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// startRelay relays relayAddr of the node namespace to the API server.
func (e *env) startRelay() {
	e.t.Helper()
	u, err := url.Parse(e.cp.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	stop, err := e.sb.Node.Forward(e.relayAddr, u.Host)
	if err != nil {
		e.t.Fatalf("relay to the API server: %v", err)
	}
	e.stopRelay = stop
}

// stopAPIServer stops kube-apiserver and the relay, so that the agent's
// connection attempts are refused as they would be by a host whose
// kube-apiserver is down (the relay alone would accept each connection and
// then reset it, which client-go handles differently).
func (e *env) stopAPIServer() {
	e.t.Helper()
	e.stopRelay()
	e.stopRelay = nil
	if err := e.cp.StopAPIServer(); err != nil {
		e.t.Fatal(err)
	}
}

// restartAPIServer starts kube-apiserver again, waits for it to be ready,
// and restarts the relay.
func (e *env) restartAPIServer() {
	e.t.Helper()
	if err := e.cp.RestartAPIServer(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.startRelay()
}

// backend is one endpoint of a test Service: the pod's name and address.
type backend struct{ pod, ip string }

// addPods starts a pod (servers on podPort) for each backend not yet running.
func (e *env) addPods(bs ...backend) {
	e.t.Helper()
	for _, b := range bs {
		if e.sb.Pod(b.pod) != nil {
			continue
		}
		if _, err := e.sb.AddPod(b.pod, netip.MustParseAddr(b.ip), podPort); err != nil {
			e.t.Fatal(err)
		}
	}
}

// newService returns a ClusterIP Service of testNS with one TCP port
// "http" 80 -> 8080 and an explicit clusterIP.
func newService(name, vip string, annotations, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, Annotations: annotations, Labels: labels},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: vip,
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(podPort),
			}},
		},
	}
}

// newSlice returns the EndpointSlice "<svc>-1" of Service svc with a ready
// endpoint per backend (targetRef naming the pod), plus extra labels.
func newSlice(svc string, labels map[string]string, bs ...backend) *discoveryv1.EndpointSlice {
	l := map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: managedBy}
	for k, v := range labels {
		l[k] = v
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: testNS, Name: svc + "-1", Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](podPort),
		}},
	}
	setEndpoints(sl, bs...)
	return sl
}

// setEndpoints replaces the slice's endpoints with ready ones for bs.
func setEndpoints(sl *discoveryv1.EndpointSlice, bs ...backend) {
	sl.Endpoints = nil
	for _, b := range bs {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{b.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: testNS, Name: b.pod},
		})
	}
}

// create creates a Service and (when not nil) its EndpointSlice as admin.
func (e *env) create(svc *corev1.Service, sl *discoveryv1.EndpointSlice) {
	e.t.Helper()
	ctx := e.t.Context()
	if _, err := e.admin.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Service %s: %v", svc.Name, err)
	}
	if sl != nil {
		if _, err := e.admin.DiscoveryV1().EndpointSlices(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			e.t.Fatalf("create EndpointSlice %s: %v", sl.Name, err)
		}
	}
}

// annotate sets (or, with value "", removes) an annotation of Service name.
func (e *env) annotate(name, key, value string) {
	e.t.Helper()
	ctx := e.t.Context()
	svcs := e.admin.CoreV1().Services(testNS)
	svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	if value == "" {
		delete(svc.Annotations, key)
	} else {
		svc.Annotations[key] = value
	}
	if _, err := svcs.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("update Service %s: %v", name, err)
	}
}

// agentArgs are the flags of every agent the tests start; extra flags
// come after them and win.
func (e *env) agentArgs(kubeconfig string, extra ...string) []string {
	args := []string{
		"run", "--kubeconfig", kubeconfig, "--node-name", nodeName,
		"--cluster-cidr", sandbox.ClusterCIDR.String(),
		"--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr,
		"--log-level", "debug", "--mode", agentMode,
	}
	return append(args, extra...)
}

// startAgent runs the agent in the node namespace with kubeconfig (the
// control plane's, reached through the relay) and waits for its first
// successful sync.
func (e *env) startAgent(kubeconfig string, extra ...string) *sandbox.Agent {
	e.t.Helper()
	start := time.Now()
	a, err := e.sb.StartAgent(steelyardBin, e.agentArgs(kubeconfig, extra...)...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.agent = a
	e.waitSynced(a, 30*time.Second)
	e.t.Logf("agent %d synced %v after start", a.Pid(), time.Since(start).Round(time.Millisecond))
	return a
}

// waitSynced waits until the agent's log shows a completed sync.
func (e *env) waitSynced(a *sandbox.Agent, timeout time.Duration) {
	e.t.Helper()
	sandbox.Poll(e.t, timeout, 20*time.Millisecond, "the agent's first sync", func() (bool, string) {
		if exited, err := a.Exited(); exited {
			e.t.Fatalf("agent exited: %v\n%s", err, tail(a.Log(), 30))
		}
		return syncedLines(a.Log()) > 0, "no \"synced\" line in the log"
	})
}

// syncedLines counts the completed syncs in an agent's (text) log.
func syncedLines(log string) int {
	return strings.Count(log, "msg=synced")
}

// steelyard runs a steelyard command in the node namespace and returns its
// standard output and error and its exit code (-1: did not run).
// explain, verify and cleanup get the suite's --mode.
func (e *env) steelyard(args ...string) (stdout, stderr string, code int) {
	if len(args) > 0 && (args[0] == "explain" || args[0] == "verify" || args[0] == "cleanup") {
		args = append([]string{args[0], "--mode", agentMode}, args[1:]...)
	}
	o, s, err := e.sb.Node.Exec2(append([]string{steelyardBin}, args...)...)
	return o, s, sandbox.ExitCode(err)
}

// explain returns `steelyard explain -o json` of the node namespace.
func (e *env) explain() []dataplane.ServiceView {
	e.t.Helper()
	out, errOut, code := e.steelyard("explain", "-o", "json")
	if code != 0 {
		e.t.Fatalf("explain: exit %d: %s", code, errOut)
	}
	var views []dataplane.ServiceView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		e.t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	return views
}

// verify runs `steelyard verify --kubeconfig <admin>` plus extra flags in
// the node namespace and returns its output and exit code.
func (e *env) verify(extra ...string) (string, int) {
	o, s, code := e.steelyard(append([]string{"verify", "--kubeconfig", e.cp.Kubeconfig}, extra...)...)
	return o + s, code
}

// waitVerify polls verify until it passes and returns how long that took.
func (e *env) waitVerify(timeout time.Duration, extra ...string) time.Duration {
	e.t.Helper()
	return sandbox.Poll(e.t, timeout, 100*time.Millisecond, "verify --kubeconfig", func() (bool, string) {
		out, code := e.verify(extra...)
		return code == 0, fmt.Sprintf("exit %d:\n%s", code, out)
	})
}

// waitShares polls explain until vip:80 shows exactly want (IP -> percent)
// and returns how long that took.
func (e *env) waitShares(vip string, want map[string]float64, timeout time.Duration) time.Duration {
	e.t.Helper()
	return sandbox.Poll(e.t, timeout, 20*time.Millisecond, "explain "+vip+" showing "+fmt.Sprint(want), func() (bool, string) {
		got := viewcheck.Shares(viewcheck.Find(e.explain(), vip, servicePort))
		return viewcheck.Same(got, want), fmt.Sprintf("explain shows %v", got)
	})
}

func vipPort(vip string) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(vip), servicePort)
}

// metrics scrapes the agent's /metrics inside the node namespace: series
// (name with labels, as printed) -> value.
func (e *env) metrics() map[string]float64 {
	e.t.Helper()
	code, body, err := e.sb.Node.HTTPGet("http://"+metricsAddr+"/metrics", 5*time.Second)
	if err != nil || code != 200 {
		e.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// histogram summarises a scraped histogram: its count and sum, and the
// smallest bucket bound holding every observation (an upper bound of the
// largest one; +Inf when it is above the last bucket).
func histogram(m map[string]float64, name string) (count, sum, maxBound float64) {
	count, sum = m[name+"_count"], m[name+"_sum"]
	maxBound = math.Inf(1)
	prefix := name + `_bucket{le="`
	for series, v := range m {
		if !strings.HasPrefix(series, prefix) {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(series, prefix), `"}`), 64)
		if err == nil && v >= count && le < maxBound {
			maxBound = le
		}
	}
	return count, sum, maxBound
}

// ruleset returns the node namespace's rules of the suite's mode:
// `iptables-save`, or `nft list ruleset` in nftables mode.
func (e *env) ruleset() string {
	e.t.Helper()
	cmd := []string{"iptables-save"}
	if agentMode == "nftables" {
		cmd = []string{"nft", "list", "ruleset"}
	}
	out, err := e.sb.Node.Exec(cmd...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// sharedChains hold rules for every Service; the others belong to one.
var sharedChains = map[string]bool{
	"STEELYARD-SERVICES": true, "STEELYARD-MARK-MASQ": true,
	"STEELYARD-POSTROUTING": true, "STEELYARD-FORWARD": true,
}

// weightMapRef is a rule's reference to a weight map of one Service port
// (nftables mode: the counted DNAT maps kc-/kl- of --count-connections,
// nc-/nl- before their key was the draw alone, and the per-port
// dc-/dl-/wc-/wl- maps of tables before the shared dn-/wv- (earlier
// dm-/wm-) maps, which belong to no one port and are not listed).
var weightMapRef = regexp.MustCompile(`@((?:kc|kl|nc|nl|dc|dl|wc|wl)-[a-z0-9]+)`)

// serviceChains returns the steelyard chains of a ruleset (see ruleset)
// that belong to Service ns/name alone: in iptables those holding or jumped
// to by a rule whose comment names it; in nftables the chains whose
// readable name suffix names it and the weight maps they read.
func serviceChains(save, nsName string) []string {
	found := map[string]bool{}
	if agentMode == "nftables" {
		// The port's chains, and the weight maps their rules read (a port
		// without affinity has no endpoint chains: its split DNATs
		// through its map).
		in := false
		for _, l := range strings.Split(save, "\n") {
			f := strings.Fields(l)
			if len(f) >= 2 && f[0] == "chain" {
				in = strings.Contains(f[1], "-"+nsName+"/")
				if in {
					found[strings.Trim(f[1], `"`)] = true
				}
				continue
			}
			if strings.TrimSpace(l) == "}" {
				in = false
			}
			if in {
				for _, m := range weightMapRef.FindAllStringSubmatch(l, -1) {
					found[m[1]] = true
				}
			}
		}
	}
	for _, l := range strings.Split(save, "\n") {
		if !strings.Contains(l, `"`+nsName+":") {
			continue
		}
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if (f[i] == "-A" || f[i] == "-j" || f[i] == "-g") && strings.HasPrefix(f[i+1], "STEELYARD-") && !sharedChains[f[i+1]] {
				found[f[i+1]] = true
			}
		}
	}
	out := make([]string, 0, len(found))
	for c := range found {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// events returns steelyard's Events about Service name in testNS (the API
// server writes its own too: its ClusterIP repair loop may report a
// Service created with a fixed clusterIP as "not allocated; repairing").
func (e *env) events(name string) []corev1.Event {
	e.t.Helper()
	list, err := e.admin.CoreV1().Events(testNS).List(e.t.Context(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == "Service" && ev.InvolvedObject.Name == name && ev.Source.Component == "steelyard" {
			out = append(out, ev)
		}
	}
	return out
}

// waitEvent polls until an Event with reason about Service name exists
// whose message contains substr, and returns it.
func (e *env) waitEvent(name, reason, substr string, timeout time.Duration) corev1.Event {
	e.t.Helper()
	var found corev1.Event
	took := sandbox.Poll(e.t, timeout, 100*time.Millisecond, "Event "+reason+" on Service "+name, func() (bool, string) {
		evs := e.events(name)
		for _, ev := range evs {
			if ev.Reason == reason && strings.Contains(ev.Message, substr) {
				found = ev
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d Events on it: %v", len(evs), evs)
	})
	e.t.Logf("Event %s %s on %s/%s after %v (source %s/%s, count %d): %s", found.Type, found.Reason,
		found.InvolvedObject.Namespace, found.InvolvedObject.Name, took.Round(time.Millisecond),
		found.Source.Component, found.Source.Host, found.Count, found.Message)
	return found
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
