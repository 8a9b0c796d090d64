//go:build node && multinode

// The multi-node tests (`make multinode`: tags node,multinode, -run
// '^TestMultiNode'): the same harness with three nodes on a node LAN
// (test/node/cluster/lan.go), steelyard from manifests/ on each. The
// single-node tests of this package expect one node: run them without the
// multinode tag (`make node`).

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// Three nodes, dual-stack as issue 20 wants them (multinode_dualstack_test.go).
func init() { wantNodes, wantDualStack = 3, true }

// The cluster is what the multi-node suites build on: every node Ready
// with its own pod range from node IPAM (inside PodCIDR, disjoint), its
// zone, the DaemonSet's pod Ready on it and its conflist chained; a pod on
// one node reaches a pod on another at its pod IP (the routes between the
// ranges).
func TestMultiNodeCluster(t *testing.T) {
	if len(node.Nodes) != wantNodes {
		t.Fatalf("%d nodes, want %d", len(node.Nodes), wantNodes)
	}
	zones := map[string]bool{}
	var ranges []netip.Prefix
	for _, n := range node.Nodes {
		obj, err := node.Client().CoreV1().Nodes().Get(t.Context(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		podCIDRs := []netip.Prefix{n.PodCIDR}
		if node.DualStack() {
			podCIDRs = append(podCIDRs, n.PodCIDR6)
		}
		if fmt.Sprint(obj.Spec.PodCIDRs) != fmt.Sprint(podCIDRs) {
			t.Errorf("node %s: spec.podCIDRs %v, harness uses %v", n.Name, obj.Spec.PodCIDRs, podCIDRs)
		}
		if !cluster.PodCIDR.Contains(n.PodCIDR.Addr()) || n.PodCIDR.Bits() != cluster.NodeCIDRMaskSize {
			t.Errorf("node %s: pod range %s not a /%d of %s", n.Name, n.PodCIDR, cluster.NodeCIDRMaskSize, cluster.PodCIDR)
		}
		for _, r := range ranges {
			if r.Overlaps(n.PodCIDR) {
				t.Errorf("node %s: pod range %s overlaps %s", n.Name, n.PodCIDR, r)
			}
		}
		ranges = append(ranges, n.PodCIDR)
		zone := obj.Labels[corev1.LabelTopologyZone]
		if zone != n.Zone {
			t.Errorf("node %s: zone label %q, want %q", n.Name, zone, n.Zone)
		}
		zones[zone] = true
		var internal []string
		for _, a := range obj.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		wantIPs := []string{n.IP.String()}
		if node.DualStack() {
			wantIPs = append(wantIPs, n.IP6.String())
		}
		if fmt.Sprint(internal) != fmt.Sprint(wantIPs) {
			t.Errorf("node %s: InternalIPs %v, want %v", n.Name, internal, wantIPs)
		}
		p := steelyardPodOn(t, n.Name)
		if len(p.Status.ContainerStatuses) != 1 || !p.Status.ContainerStatuses[0].Ready {
			t.Errorf("node %s: steelyard pod %s not Ready: %+v", n.Name, p.Name, p.Status.ContainerStatuses)
		}
		// Installed without a cluster CIDR: each agent took its Node's
		// range.
		wantLocalDetection(t, p, "NodeCIDR", podCIDRs...)
		conf, err := os.ReadFile(filepath.Join(n.CNIConfDir, cluster.MainConflist))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(conf), `"steelyard-cni"`) || !strings.Contains(string(conf), n.PodCIDR.String()) {
			t.Errorf("node %s: conflist not chained or not on %s:\n%s", n.Name, n.PodCIDR, conf)
		}
		t.Logf("node %s: %s, pods %s, %s, steelyard pod %s Ready", n.Name, n.IP, n.PodCIDR, zone, p.Name)
	}
	if len(zones) != 3 {
		t.Errorf("zones %v, want 3", zones)
	}

	// Pod to pod across nodes, at the pod IP (no Service): client pods on
	// every node dial the netexec pod of every other node.
	clients := clientsOnEveryNode(t)
	for _, from := range clients {
		for _, to := range clients {
			if from.Spec.NodeName == to.Spec.NodeName {
				continue
			}
			got, errs, err := dial(t.Context(), from, to.Status.PodIP, 8080, 5)
			if err != nil || len(errs) != 0 || len(got) != 5 || got[0] != to.Name {
				t.Errorf("pod %s (%s) to pod %s %s (%s): answers %v, errors %v, %v", from.Name, from.Spec.NodeName, to.Name, to.Status.PodIP, to.Spec.NodeName, got, errs, err)
			} else {
				t.Logf("pod %s (%s) to pod %s at %s (%s): 5 of 5 answered", from.Name, from.Spec.NodeName, to.Name, to.Status.PodIP, to.Spec.NodeName)
			}
		}
	}
}

// A weighted Service (10/90 by steelyard.io/weights) whose two pods run on
// nodes 1 and 2: new connections from a client pod on each of the three
// nodes (agnhost's /dial through the API server's pod proxy) and from
// outside the nodes (a namespace on the node LAN) through the NodePort of
// node 3, which runs none of the pods, split 10/90 within 1.5 points.
func TestMultiNodeWeightedService(t *testing.T) {
	if len(node.Nodes) < 3 {
		t.Fatalf("%d nodes, want 3", len(node.Nodes))
	}
	spec := strings.ReplaceAll(cluster.NetexecPodSpec, "\n    ", "\n")
	var docs []string
	for i, w := range []string{"mn-w1", "mn-w2"} {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, labels: {app: mn-web}}
spec:
  nodeName: %s`, w, node.Nodes[i].Name)+spec)
	}
	docs = append(docs, `apiVersion: v1
kind: Service
metadata:
  name: mn-web
  namespace: default
  annotations: {steelyard.io/weights: "mn-w1=10,mn-w2=90"}
spec:
  type: NodePort
  selector: {app: mn-web}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	apply(t, strings.Join(docs, "---\n"))
	clients := clientsOnEveryNode(t)
	waitReady(t, "app=mn-web", 2, 2*time.Minute)
	waitSliceReady(t, "mn-web", 2, time.Minute)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	vip := clusterIP(t, "mn-web")
	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), "mn-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort := uint16(svc.Spec.Ports[0].NodePort)

	// Per client: 6,400 new connections at 10/90 give sigma =
	// sqrt(0.1*0.9/6400) = 0.375 points, so 1.5 points is 4 sigma.
	const n, tol = 6400, 1.5
	want := map[string]float64{"mn-w1": 10, "mn-w2": 90}
	check := func(who string, names map[string]int, fails int, errs map[string]int) {
		total := 0
		for _, c := range names {
			total += c
		}
		if fails != 0 {
			t.Errorf("%s: %d of %d connections failed: %v", who, fails, n, errs)
		}
		if total == 0 {
			t.Errorf("%s: no answers", who)
			return
		}
		for name, w := range want {
			if got := 100 * float64(names[name]) / float64(total); math.Abs(got-w) > tol {
				t.Errorf("%s: %s %.2f%%, want %.0f%% +- %.1f", who, name, got, w, tol)
			}
		}
		for name := range names {
			if _, ok := want[name]; !ok {
				t.Errorf("%s: answered by %q, not a backend", who, name)
			}
		}
	}
	// The four clients at once, each one connection after the other
	// (agnhost's /dial), the outside one 8 at a time.
	type result struct {
		who         string
		names, errs map[string]int
		fails       int
		err         error
		took        time.Duration
		dst         string
	}
	results := make([]result, len(clients)+1)
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := result{who: fmt.Sprintf("pod %s on %s", c.Name, c.Spec.NodeName), names: map[string]int{}, errs: map[string]int{}, dst: vip.String()}
			t0 := time.Now()
			// Batches keep each pod-proxy request well inside its timeouts.
			for done := 0; done < n && r.err == nil; done += 400 {
				var got, bad []string
				got, bad, r.err = dial(t.Context(), c, vip.Addr().String(), int(vip.Port()), 400)
				for _, g := range got {
					r.names[g]++
				}
				for _, e := range bad {
					r.fails++
					r.errs[shorten(e)]++
				}
			}
			r.took = time.Since(t0)
			results[i] = r
		}()
	}
	outside, err := node.AddLANClient()
	if err != nil {
		t.Fatal(err)
	}
	empty := node.Nodes[2]
	dst := netip.AddrPortFrom(empty.IP, nodePort)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		r := connections(outside.Do, dst, n, 8)
		results[len(clients)] = result{who: fmt.Sprintf("outside client %s via NodePort of %s", outside.Addr, empty.Name),
			names: r.names, errs: r.errors, fails: r.fails, took: time.Since(t0), dst: dst.String()}
	}()
	wg.Wait()
	for _, r := range results {
		if r.err != nil {
			t.Errorf("%s: %v", r.who, r.err)
			continue
		}
		t.Logf("%s: %d connections to %s in %v: %v, %d failed", r.who, n, r.dst, r.took.Round(time.Millisecond), r.names, r.fails)
		check(r.who, r.names, r.fails, r.errs)
	}
}

var (
	clientsOnce sync.Once
	clientPods  []corev1.Pod
)

// clientsOnEveryNode starts (once for the suite; the cluster's teardown
// removes them) an agnhost netexec pod on each node, the source of
// pod-side traffic, and returns them Ready.
func clientsOnEveryNode(t *testing.T) []corev1.Pod {
	t.Helper()
	clientsOnce.Do(func() {
		var docs []string
		for k, n := range node.Nodes {
			docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: mn-client-%d, namespace: default, labels: {app: mn-client}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  securityContext:
    sysctls: [{name: net.ipv4.ip_local_port_range, value: "1024 65535"}]
  containers:
  - name: netexec
    image: %s
    imagePullPolicy: IfNotPresent
    args: ["netexec", "--http-port=8080"]
    readinessProbe:
      httpGet: {path: /hostname, port: 8080}
      periodSeconds: 1
`, k+1, n.Name, cluster.AgnhostImage))
		}
		f := filepath.Join(os.TempDir(), fmt.Sprintf("steelyard-multinode-clients-%d.yaml", os.Getpid()))
		if err := os.WriteFile(f, []byte(strings.Join(docs, "---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f)
		kubectl(t, "apply", "-f", f)
		clientPods = waitReady(t, "app=mn-client", len(node.Nodes), 2*time.Minute)
	})
	if len(clientPods) != len(node.Nodes) {
		t.Fatalf("client pods: %d of %d started", len(clientPods), len(node.Nodes))
	}
	return clientPods
}

// dial asks agnhost netexec's /dial in pod from (through the API server's
// pod proxy) to make tries new HTTP connections to host:port, one after
// the other, and returns the answers (/hostname: the pod names) and the
// errors of the connections.
func dial(ctx context.Context, from corev1.Pod, host string, port, tries int) (answers, errs []string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	body, err := node.Client().CoreV1().Pods(from.Namespace).ProxyGet("http", from.Name, "8080", "dial", map[string]string{
		"request": "hostname", "protocol": "http", "host": host, "port": fmt.Sprint(port), "tries": fmt.Sprint(tries),
	}).DoRaw(ctx)
	var out struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if jerr := json.Unmarshal(body, &out); jerr != nil {
		return nil, nil, fmt.Errorf("dial from %s to %s:%d: %v %v: %.200s", from.Name, host, port, err, jerr, body)
	}
	// agnhost leaves the answers out when the last try failed: count
	// those as lost, the errors are there.
	if len(out.Responses)+len(out.Errors) != tries && len(out.Errors) == 0 {
		return nil, nil, fmt.Errorf("dial from %s to %s:%d: %d answers and %d errors for %d tries", from.Name, host, port, len(out.Responses), len(out.Errors), tries)
	}
	return out.Responses, out.Errors, nil
}

func shorten(s string) string {
	if len(s) > 80 {
		return s[:80]
	}
	return s
}

// waitSliceReady waits until the Service's EndpointSlices list n
// endpoints, all ready (a terminating one still listed does not count as
// gone).
func waitSliceReady(t *testing.T, svc string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		l, err := node.Client().DiscoveryV1().EndpointSlices("default").List(t.Context(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		ready, total := 0, 0
		if err == nil {
			for _, s := range l.Items {
				for _, e := range s.Endpoints {
					total++
					if e.Conditions.Ready != nil && *e.Conditions.Ready {
						ready++
					}
				}
			}
			if ready == n && total == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Service %s: %d endpoints, %d ready after %v, want %d ready (%v)", svc, total, ready, timeout, n, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// steelyardPodOn returns the DaemonSet's pod on node name.
func steelyardPodOn(t testing.TB, name string) corev1.Pod {
	t.Helper()
	pods, err := node.Client().CoreV1().Pods("steelyard").List(t.Context(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=steelyard", FieldSelector: "spec.nodeName=" + name,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			return p
		}
	}
	t.Fatalf("no steelyard pod on node %s", name)
	return corev1.Pod{}
}

// waitVerifyOn waits until `steelyard verify` in the agent's pod on node
// name says that node's kernel equals the desired state.
func waitVerifyOn(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	p := steelyardPodOn(t, name)
	deadline := time.Now().Add(timeout)
	for {
		// No --mode: the DaemonSet's STEELYARD_MODE gives verify the
		// agent's mode (a run with STEELYARD_NODE_MODE=nftables checks it).
		argv := []string{"-n", "steelyard", "exec", p.Name, "-c", "steelyard", "--", "steelyard", "verify"}
		out, err := node.Kubectl(t.Context(), argv...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: steelyard verify after %v: %v\n%s", name, timeout, err, out)
		}
		time.Sleep(time.Second)
	}
}
