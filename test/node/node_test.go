//go:build node

package node

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// The tests run in this file's order; the last one deletes the
// steelyard pod.

// webOnce creates the StatefulSet web (web-0, web-1) behind Service web
// (weights 10/90) and the client pod, once for every test.
var webOnce sync.Once

func web(t *testing.T) {
	t.Helper()
	webOnce.Do(func() {
		f := filepath.Join(os.TempDir(), fmt.Sprintf("steelyard-node-web-%d.yaml", os.Getpid()))
		doc := `apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  podManagementPolicy: Parallel
  serviceName: web
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:` + cluster.NetexecPodSpec + `---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
  annotations: {steelyard.io/weights: "web-0=10,web-1=90"}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default, labels: {app: client}}
spec:
  terminationGracePeriodSeconds: 1
  # tens of thousands of short connections in two minutes: with the default
  # 28,000 ports a reused source port can meet the server's TIME_WAIT
  # socket of an earlier connection (1 reset in 37,100 once).
  securityContext:
    sysctls: [{name: net.ipv4.ip_local_port_range, value: "1024 65535"}]
  containers:
  - name: client
    image: ` + cluster.AgnhostImage + `
    imagePullPolicy: IfNotPresent
    args: ["pause"]
`
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(f)
		kubectl(t, "apply", "-f", f)
	})
	waitReady(t, "app=web", 2, 2*time.Minute)
	waitReady(t, "app=client", 1, 2*time.Minute)
}

func client(t *testing.T) inNS {
	t.Helper()
	return podNS(t, waitReady(t, "app=client", 1, time.Minute)[0])
}

// The DaemonSet from manifests/ runs: Ready through its probes, its
// install-cni chained steelyard-cni into the node's conflist, and the agent
// follows its Node's zone.
func TestDaemonSetInstalled(t *testing.T) {
	p := steelyardPod(t)
	ready := false
	for _, c := range p.Status.Conditions {
		ready = ready || c.Type == "Ready" && c.Status == "True"
	}
	if !ready || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("steelyard pod %s: ready %v, statuses %+v", p.Name, ready, p.Status.ContainerStatuses)
	}
	if img := p.Status.ContainerStatuses[0].Image; img != cluster.SteelyardImage {
		t.Errorf("image %s, want %s", img, cluster.SteelyardImage)
	}
	conf, err := os.ReadFile(filepath.Join(node.CNIConfDir, cluster.MainConflist))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), `"steelyard-cni"`) {
		t.Fatalf("conflist not chained:\n%s", conf)
	}
	if _, err := os.Stat(filepath.Join(node.CNIBinDir, "steelyard-cni")); err != nil {
		t.Fatal(err)
	}
	t.Logf("steelyard pod %s Ready (probes), conflist chained, image %s", p.Name, cluster.SteelyardImage)

	// The Node's zone changes: the agent follows it without a restart.
	kubectl(t, "label", "node", node.NodeName, "topology.kubernetes.io/zone=zone-b", "--overwrite")
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := node.Kubectl(t.Context(), "-n", "steelyard", "logs", p.Name, "-c", "steelyard")
		if strings.Contains(out, `"zone":"zone-b"`) && strings.Contains(out, node.NodeIP.String()) {
			t.Logf("agent saw the Node's new zone: %s", lastLineWith(out, "zone-b"))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not log zone-b within 30 s:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// The image carries the tools of every --mode, not only the one this
// suite runs: the conformance run (make conformance) found the nftables
// mode crash-looping on "could not find nftables binary" because the
// image had no nft.
func TestImageHasEveryModesTools(t *testing.T) {
	// ipvsadm --version needs IPVS in the kernel (not here): presence only.
	for _, argv := range [][]string{
		{"iptables", "--version"}, {"ipset", "--version"}, {"sh", "-c", "command -v ipvsadm"},
		{"nft", "--version"}, {"conntrack", "--version"},
	} {
		out, err := inSteelyard(t, argv...)
		if err != nil {
			t.Errorf("%s in the steelyard image: %v", strings.Join(argv, " "), err)
			continue
		}
		t.Logf("%s", strings.TrimSpace(firstLineOf(out)))
	}
}

func firstLineOf(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func lastLineWith(s, sub string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return lines[i]
		}
	}
	return ""
}

// 10/90 by annotation on a StatefulSet's pods, the EndpointSlice written
// by kube-controller-manager, new connections from a client pod.
func TestWeightsFromClientPod(t *testing.T) {
	web(t)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "web")
	// 8,000 at 10/90: sigma 0.34 points; 1.5 points is 4.5 sigma.
	const n = 8000
	t0 := time.Now()
	r := connections(client(t), vip, n, 8)
	t.Logf("%d connections to %s from pod client in %v: %v, %d failed %v", n, vip, time.Since(t0).Round(time.Millisecond), r.names, r.fails, r.errors)
	if r.fails != 0 {
		t.Errorf("%d connections failed: %v", r.fails, r.errors)
	}
	for name, want := range map[string]float64{"web-0": 10, "web-1": 90} {
		if got := r.share(name); math.Abs(got-want) > 1.5 {
			t.Errorf("%s: %.2f%%, want %.0f%% +- 1.5", name, got, want)
		}
	}
}

// A split Service over the StatefulSet's Service (itself 10/90) and a
// one-pod canary Deployment: 90/10 between them, web's own weights inside.
func TestSplitService(t *testing.T) {
	web(t)
	apply(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: canary, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: canary}}
  template:
    metadata: {labels: {app: canary}}
    spec:`+cluster.NetexecPodSpec+`---
apiVersion: v1
kind: Service
metadata: {name: canary, namespace: default}
spec:
  selector: {app: canary}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata:
  name: front
  namespace: default
  annotations: {steelyard.io/split: "web=90,canary=10"}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	pods := waitReady(t, "app=canary", 1, 2*time.Minute)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "front")
	r := connections(client(t), vip, 6000, 8)
	t.Logf("6000 connections to split Service front %s: %v, %d failed", vip, r.names, r.fails)
	if r.fails != 0 {
		t.Errorf("%d failed: %v", r.fails, r.errors)
	}
	// 6,000 draws: sigma at most 0.65 points; 2.5 points is 3.8 sigma.
	for name, want := range map[string]float64{"web-0": 9, "web-1": 81, pods[0].Name: 10} {
		if got := r.share(name); math.Abs(got-want) > 2.5 {
			t.Errorf("%s: %.2f%%, want %.0f%% +- 2.5", name, got, want)
		}
	}
}

// The slice-level weight on the EndpointSlice kube-controller-manager
// writes for a Deployment, beside a hand-made slice of the same Service
// (weight 1): 4:4:1. Then the Deployment scales and the controller
// rewrites its slice: does the annotation survive?
func TestSliceWeightOnControllerSlice(t *testing.T) {
	web(t)
	apply(t, `apiVersion: apps/v1
kind: Deployment
metadata: {name: heavy, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: heavy}}
  template:
    metadata: {labels: {app: heavy}}
    spec:`+cluster.NetexecPodSpec+`---
apiVersion: v1
kind: Service
metadata: {name: heavy, namespace: default}
spec:
  selector: {app: heavy}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	heavy := waitReady(t, "app=heavy", 2, 2*time.Minute)
	web0 := waitReady(t, "statefulset.kubernetes.io/pod-name=web-0", 1, time.Minute)[0]
	apply(t, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: heavy-extra
  namespace: default
  labels: {kubernetes.io/service-name: heavy, endpointslice.kubernetes.io/managed-by: steelyard-test}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: ["`+web0.Status.PodIP+`"]
  conditions: {ready: true}
  targetRef: {kind: Pod, namespace: default, name: web-0}
`)
	annotate := func() {
		t.Helper()
		slices, err := node.Client().DiscoveryV1().EndpointSlices("default").List(t.Context(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=heavy,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"})
		if err != nil || len(slices.Items) != 1 {
			t.Fatalf("controller slices of heavy: %v, %v", slices, err)
		}
		kubectl(t, "annotate", "endpointslice", slices.Items[0].Name, "steelyard.io/weight=4", "--overwrite")
	}
	annotate()
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "heavy")
	measure := func(want map[string]float64) {
		t.Helper()
		r := connections(client(t), vip, 6000, 8)
		t.Logf("6000 connections to %s: %v, %d failed", vip, r.names, r.fails)
		for name, w := range want {
			if got := r.share(name); math.Abs(got-w) > 2.5 {
				t.Errorf("%s: %.2f%%, want %.1f%% +- 2.5", name, got, w)
			}
		}
	}
	measure(map[string]float64{heavy[0].Name: 400.0 / 9, heavy[1].Name: 400.0 / 9, "web-0": 100.0 / 9})

	kubectl(t, "scale", "deployment/heavy", "--replicas=3")
	heavy = waitReady(t, "app=heavy", 3, 2*time.Minute)
	time.Sleep(2 * time.Second)
	waitVerify(t, 30*time.Second)
	slices, err := node.Client().DiscoveryV1().EndpointSlices("default").List(t.Context(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=heavy,endpointslice.kubernetes.io/managed-by=endpointslice-controller.k8s.io"})
	if err != nil || len(slices.Items) != 1 {
		t.Fatalf("controller slices of heavy: %v, %v", slices, err)
	}
	kept := slices.Items[0].Annotations["steelyard.io/weight"]
	t.Logf("after the controller rewrote its slice (3 endpoints): steelyard.io/weight=%q", kept)
	if kept == "4" {
		measure(map[string]float64{heavy[0].Name: 400.0 / 13, heavy[1].Name: 400.0 / 13, heavy[2].Name: 400.0 / 13, "web-0": 100.0 / 13})
	} else {
		t.Errorf("kube-controller-manager dropped the slice's steelyard.io/weight annotation when it rewrote the slice")
	}
}

// A pod reaches itself through its VIP (hairpin: steelyard-cni turned on
// hairpin mode on its bridge port, the agent masquerades the connection).
func TestHairpin(t *testing.T) {
	web(t)
	apply(t, `apiVersion: v1
kind: Service
metadata: {name: self, namespace: default}
spec:
  selector: {statefulset.kubernetes.io/pod-name: web-0}
  ports: [{port: 80, targetPort: 8080}]
`)
	waitVerify(t, 30*time.Second)
	pods := waitReady(t, "statefulset.kubernetes.io/pod-name=web-0", 1, time.Minute)
	vip := clusterIP(t, "self")
	r := connections(podNS(t, pods[0]), vip, 20, 1)
	if r.fails != 0 || r.names["web-0"] != 20 {
		t.Fatalf("web-0 to its own VIP %s: %v, %d failed %v", vip, r.names, r.fails, r.errors)
	}
	// Every pod's bridge port (all created after install-cni chained the
	// plugin) has hairpin mode on.
	out, err := node.Sandbox.Node.Exec("sh", "-c", "for p in /sys/class/net/"+cluster.BridgeName+"/brif/*; do echo ${p##*/} $(cat $p/hairpin_mode); done")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasSuffix(l, " 1") {
			t.Errorf("bridge port without hairpin mode: %q", l)
		}
	}
	t.Logf("web-0 -> %s (self) -> web-0: 20/20; hairpin on every bridge port: %s", vip, strings.ReplaceAll(strings.TrimSpace(out), "\n", ", "))
}

// NodePort with externalTrafficPolicy Local, and its health check node
// port, from a client namespace outside the node.
func TestNodePortLocalFromOutside(t *testing.T) {
	web(t)
	apply(t, `apiVersion: v1
kind: Service
metadata:
  name: web-local
  namespace: default
  annotations: {steelyard.io/weights: "web-0=10,web-1=90"}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`)
	waitVerify(t, 30*time.Second)
	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), "web-local", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	np, hc := svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort
	outside, err := node.Sandbox.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(node.NodeIP, uint16(np))
	r := connections(outside.Do, dst, 2000, 4)
	t.Logf("2000 connections from %s to node port %s: %v, %d failed", outside.Addr, dst, r.names, r.fails)
	if r.fails != 0 || r.ok() != 2000 {
		t.Errorf("%d failed: %v", r.fails, r.errors)
	}
	// 2,000 at 10/90: sigma 0.67 points.
	if got := r.share("web-0"); math.Abs(got-10) > 3 {
		t.Errorf("web-0 through the node port: %.2f%%, want 10 +- 3", got)
	}
	code, body, err := outside.HTTPGet(fmt.Sprintf("http://%s:%d/healthz", node.NodeIP, hc), 5*time.Second)
	if err != nil || code != 200 || !strings.Contains(body, `"localEndpoints": 2`) && !strings.Contains(body, `"localEndpoints":2`) {
		t.Fatalf("health check node port %d: %d %q %v", hc, code, body, err)
	}
	t.Logf("health check node port %d: %d %s", hc, code, strings.TrimSpace(body))
}

// `kubectl exec` into the steelyard pod: explain and verify as documented.
func TestExplainVerifyInPod(t *testing.T) {
	web(t)
	waitVerify(t, 30*time.Second)
	out, err := inSteelyard(t, "steelyard", "explain")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	line := lastLineWith(out, "default/web:http")
	if !strings.Contains(line, "10.00%") || !strings.Contains(line, "90.00%") {
		t.Fatalf("explain has no 10/90 line for default/web:\n%s", out)
	}
	t.Logf("explain: %s", line)
	if out, err := inSteelyard(t, "steelyard", "verify"); err != nil {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}

// kubectl scale 5 <-> 7 every 10-12 s for 2 minutes under bounded load
// from the client pod; pods have a preStop pause. Not one connection may
// fail, and the kernel ends equal to verify's desired state.
func TestScaleChurnZeroFailures(t *testing.T) {
	res := churn{name: "churn", lo: 5, hi: 7, duration: 2 * time.Minute,
		period: func(i int) time.Duration { return time.Duration(10000+(i%3)*1000) * time.Millisecond }}.run(t)
	if res.failed != 0 {
		t.Error(res.failedMsg())
	}
}

// Issue 20's case: kubectl scale 3 <-> 6 every 8 s (half the pods go at
// each scale-down, and the next scale comes 3 s after their preStop pause
// ends), the 5 s preStop pause users run, bounded load from the client pod:
// 0 failed new connections.
func TestScaleChurnHalfEvery8s(t *testing.T) {
	res := churn{name: "churn8", lo: 3, hi: 6, duration: 2 * time.Minute,
		period: func(int) time.Duration { return 8 * time.Second }}.run(t)
	if res.failed != 0 {
		t.Error(res.failedMsg())
	}
}

// steelyardRules is every STEELYARD line of both iptables flavours in the
// node namespace, counters stripped.
func steelyardRules(t *testing.T) []string {
	t.Helper()
	var lines []string
	for _, cmd := range []string{"iptables-nft-save", "iptables-legacy-save"} {
		out, err := node.Sandbox.Node.Exec(cmd)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(out, "\n") {
			if !strings.Contains(l, "STEELYARD") {
				continue
			}
			if i := strings.Index(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
				l = l[:i]
			}
			lines = append(lines, cmd+": "+l)
		}
	}
	return lines
}

// The DaemonSet pod deleted: its controller makes a new one, established
// connections keep working all along, and the rules are never flushed.
func TestDaemonSetPodRecreated(t *testing.T) {
	web(t)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "web")
	cl := client(t)
	type kept struct {
		c    interface{ Close() error }
		name string
	}
	var conns []*kept
	var open []func() (string, error)
	for range 8 {
		c, err := dialIn(cl, vip, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		name, err := getHostname(c, "keep-alive")
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, &kept{c: c, name: name})
		open = append(open, func() (string, error) { return getHostname(c, "keep-alive") })
		defer c.Close()
	}
	before := steelyardRules(t)
	if len(before) == 0 {
		t.Fatal("no STEELYARD rules in the node namespace")
	}
	old := steelyardPod(t)
	// Watch the rules while the pod goes and comes back.
	stop := make(chan struct{})
	var minRules atomic.Int64
	minRules.Store(int64(len(before)))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if n := int64(len(steelyardRules(t))); n < minRules.Load() {
				minRules.Store(n)
			}
		}
	}()
	kubectl(t, "-n", "steelyard", "delete", "pod", old.Name, "--wait=true")
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	waitVerify(t, 30*time.Second)
	close(stop)
	wg.Wait()
	newPod := steelyardPod(t)
	if newPod.Name == old.Name {
		t.Fatalf("pod %s was not replaced", old.Name)
	}
	for i, k := range conns {
		name, err := open[i]()
		if err != nil || name != k.name {
			t.Errorf("established connection %d (to %s): after the agent's restart %q, %v", i, k.name, name, err)
		}
	}
	if m := minRules.Load(); m < int64(len(before)) {
		t.Errorf("STEELYARD rules dropped from %d to %d lines while the pod was replaced", len(before), m)
	}
	after := steelyardRules(t)
	if strings.Join(before, "\n") != strings.Join(after, "\n") {
		t.Logf("rules changed across the restart (%d -> %d lines)", len(before), len(after))
	}
	t.Logf("pod %s replaced by %s; %d established connections kept answering; STEELYARD rules never fewer than %d lines", old.Name, newPod.Name, len(conns), len(before))
}
