//go:build node

package node

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The cluster every test shares (starting one node costs about 40 s).
var node *cluster.Cluster

// wantNodes is the cluster's size: one, or three with the multinode tag
// (multinode_test.go).
var wantNodes = 1

// wantDualStack makes the cluster dual-stack (cluster.Options.DualStack):
// the multi-node suite's (multinode_test.go).
var wantDualStack = false

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "node: %v: tearing the node down\n", s)
		cluster.StopAll()
		sandbox.CloseAll()
		os.Exit(130)
	}()
	// Each further node adds its containerd, image imports and kubelet.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(2+3*wantNodes)*time.Minute)
	defer cancel()
	t0 := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Nodes: wantNodes, DualStack: wantDualStack, Logf: log.Printf})
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		return 1
	}
	node = c
	defer func() {
		if err := c.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "node: teardown:", err)
		}
	}()
	if kubeProxyMode != "" {
		// The comparison run: kube-proxy instead of steelyard (and no
		// steelyard-cni in the conflist). Only the tests that do not
		// look at steelyard itself mean anything then (-run TestScaleChurn).
		if err := c.StartKubeProxy(ctx, kubeProxyMode); err != nil {
			fmt.Fprintf(os.Stderr, "node: kube-proxy: %v\n%s", err, c.Logs(40))
			return 1
		}
		log.Printf("node: kube-proxy (%s mode) instead of steelyard", kubeProxyMode)
	} else if err := install(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "node: install: %v\n%s", err, c.Logs(40))
		return 1
	}
	log.Printf("node: cluster up and steelyard installed in %v", time.Since(t0).Round(time.Second))
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "node logs:\n%s", c.Logs(40))
		if out, err := c.Kubectl(context.Background(), "-n", "steelyard", "logs", "ds/steelyard", "--tail=40"); err == nil {
			fmt.Fprintf(os.Stderr, "--- steelyard pod, last lines:\n%s", out)
		}
	}
	return code
}

// kubeProxyMode, from $STEELYARD_NODE_KUBE_PROXY ("iptables" or
// "nftables"), runs the suite's node with kube-proxy v1.37.2 of the
// control-plane cache instead of steelyard, to compare the same load
// (e.g. -run TestScaleChurn); empty: steelyard from manifests/.
var kubeProxyMode = os.Getenv("STEELYARD_NODE_KUBE_PROXY")

// manifestsDir is the repository's manifests/.
func manifestsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "manifests")
}

// agentMode, from $STEELYARD_NODE_MODE, is the agents' MODE (e.g.
// nftables, for a run of the dual-stack tests in that mode); empty: the
// chart's default.
var agentMode = os.Getenv("STEELYARD_NODE_MODE")

// install installs steelyard from manifests/ as the README says
// (cluster.Install).
func install(ctx context.Context) error {
	var config map[string]string
	if agentMode != "" {
		config = map[string]string{"MODE": agentMode}
	}
	return node.Install(ctx, []string{manifestsDir()}, config)
}

// kubectl runs kubectl as the admin, failing the test on error.
func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := node.Kubectl(t.Context(), args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// apply applies a YAML document and deletes it when the test ends.
func apply(t testing.TB, yaml string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "obj.yaml")
	if err := os.WriteFile(f, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "apply", "-f", f)
	t.Cleanup(func() {
		_, _ = node.Kubectl(context.Background(), "delete", "--wait=false", "--ignore-not-found", "-f", f)
	})
}

// waitReady waits until n pods match selector in namespace default, all
// Ready, and returns them.
func waitReady(t testing.TB, selector string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		pods, err := node.Client().CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			ready := 0
			var live []corev1.Pod
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					continue
				}
				live = append(live, p)
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready == n && len(live) == n {
				return live
			}
			last = fmt.Sprintf("%d pods, %d ready", len(live), ready)
		}
		if time.Now().After(deadline) {
			t.Fatalf("pods %s: want %d Ready after %v, have %s", selector, n, timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// inNS runs f on a thread inside a network namespace; sockets f makes
// stay there. Both a pod's namespace (podNS) and a sandbox namespace
// (sandbox.NS.Do) are one.
type inNS func(f func() error) error

// podNS opens the network namespace of a running pod's first container.
func podNS(t testing.TB, p corev1.Pod) inNS {
	t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("pod %s: no container status", p.Name)
	}
	pid, err := node.TaskPid(t.Context(), p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	h, err := ns.GetNS(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	t.Cleanup(func() { h.Close() })
	return func(f func() error) error { return h.Do(func(ns.NetNS) error { return f() }) }
}

// dialIn opens a TCP connection to dst (IPv4 or IPv6) from inside netns.
func dialIn(netns inNS, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns(func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	})
	return c, err
}

// hostname asks agnhost netexec's /hostname on a connection of its own
// (Connection: close), so each call is one new connection and one backend
// choice.
func hostname(netns inNS, dst netip.AddrPort) (string, error) {
	c, err := dialIn(netns, dst, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return getHostname(c, "close")
}

// getHostname sends one GET /hostname on c and returns the body.
func getHostname(c net.Conn, connection string) (string, error) {
	if _, err := fmt.Fprintf(c, "GET /hostname HTTP/1.1\r\nHost: x\r\nConnection: %s\r\n\r\n", connection); err != nil {
		return "", err
	}
	br := bufio.NewReader(c)
	status, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.Contains(status, " 200 ") {
		return "", fmt.Errorf("status %q", strings.TrimSpace(status))
	}
	length := -1
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimSpace(line)
		if line == "" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "Content-Length") {
			fmt.Sscan(strings.TrimSpace(v), &length)
		}
	}
	if length < 0 {
		return "", errors.New("no Content-Length")
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(br, body); err != nil {
		return "", err
	}
	return strings.TrimSpace(string(body)), nil
}

// tally is the outcome of a batch of connections.
type tally struct {
	mu     sync.Mutex
	names  map[string]int
	fails  int
	errors map[string]int
}

func (r *tally) add(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names == nil {
		r.names, r.errors = map[string]int{}, map[string]int{}
	}
	if err != nil {
		r.fails++
		msg := err.Error()
		if len(msg) > 80 {
			msg = msg[:80]
		}
		r.errors[msg]++
		return
	}
	r.names[name]++
}

func (r *tally) ok() int {
	n := 0
	for _, v := range r.names {
		n += v
	}
	return n
}

func (r *tally) share(name string) float64 { return 100 * float64(r.names[name]) / float64(r.ok()) }

// connections makes count new connections from netns to dst, conc at a
// time.
func connections(netns inNS, dst netip.AddrPort, count, conc int) *tally {
	r := &tally{}
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				r.add(hostname(netns, dst))
			}
		}()
	}
	for range count {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	return r
}

// clusterIP returns a Service's VIP and first port.
func clusterIP(t testing.TB, name string) netip.AddrPort {
	t.Helper()
	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), uint16(svc.Spec.Ports[0].Port))
}

// steelyardPod returns the DaemonSet's pod.
func steelyardPod(t testing.TB) corev1.Pod {
	t.Helper()
	pods, err := node.Client().CoreV1().Pods("steelyard").List(t.Context(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=steelyard"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p
		}
	}
	t.Fatal("no steelyard pod")
	return corev1.Pod{}
}

// inSteelyard runs a command in the steelyard pod with kubectl exec.
func inSteelyard(t testing.TB, argv ...string) (string, error) {
	t.Helper()
	return node.Kubectl(t.Context(), append([]string{"-n", "steelyard", "exec", "ds/steelyard", "-c", "steelyard", "--"}, argv...)...)
}

// waitVerify waits until `steelyard verify` in the pod says the kernel
// equals the desired state.
func waitVerify(t testing.TB, timeout time.Duration) {
	t.Helper()
	if kubeProxyMode != "" {
		// kube-proxy has no verify: give it its sync time instead.
		time.Sleep(2 * time.Second)
		return
	}
	deadline := time.Now().Add(timeout)
	for {
		out, err := inSteelyard(t, "steelyard", "verify")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("steelyard verify after %v: %v\n%s", timeout, err, out)
		}
		time.Sleep(time.Second)
	}
}

// wantLocalDetection checks the agent's log line "local traffic detection"
// in pod p: how it tells pod traffic from other sources
// (--detect-local-mode, resolved) and the pod ranges it found.
func wantLocalDetection(t testing.TB, p corev1.Pod, mode string, cidrs ...netip.Prefix) {
	t.Helper()
	out := kubectl(t, "-n", "steelyard", "logs", p.Name, "-c", "steelyard")
	for _, line := range strings.Split(out, "\n") {
		var l struct {
			Msg   string         `json:"msg"`
			Mode  string         `json:"mode"`
			CIDRs []netip.Prefix `json:"cidrs"`
			From  string         `json:"from"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "local traffic detection" {
			continue
		}
		if l.Mode != mode || !slices.Equal(l.CIDRs, cidrs) {
			t.Errorf("pod %s: local traffic detection %s %v (from %s), want %s %v", p.Name, l.Mode, l.CIDRs, l.From, mode, cidrs)
		} else {
			t.Logf("pod %s: local traffic detection %s %v from %s", p.Name, l.Mode, l.CIDRs, l.From)
		}
		return
	}
	t.Errorf("pod %s: no \"local traffic detection\" line in its log", p.Name)
}

// deploymentYAML is the YAML of a Deployment app of n netexec pods
// (cluster.NetexecPodSpec, after the pod spec fields of extraSpec, YAML
// indented for the pod template) and a Service app of type svcType on
// port 80.
func deploymentYAML(app string, n int, extraSpec, svcType string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:`, app, n) + extraSpec + cluster.NetexecPodSpec + fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: %[2]s
  selector: {app: %[1]s}
  ports: [{name: http, port: 80, targetPort: 8080}]
`, app, svcType)
}
