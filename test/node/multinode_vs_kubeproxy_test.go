//go:build node && multinode

package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// From kube-proxy to steelyard on a live cluster, node by node, and back
// (issue 20 item 4; the procedure is docs/cluster.md#from-kube-proxy-to-steelyard).
// kube-proxy v1.37.2 runs as a DaemonSet (cluster.KubeProxyManifests) in
// each mode of $STEELYARD_MIGRATE_MODES (default "iptables"; "iptables,nftables"
// runs both, steelyard in the same mode as kube-proxy), under the load of
// TestMultiNodeDrain's sources (the client pod of every node to the VIP,
// the LAN namespace to every node's node port) and with one keep-alive
// connection per source opened before each direction. Per node: steelyard
// starts beside kube-proxy (label steelyard.io/steelyard=true, its
// DaemonSet's nodeSelector), kube-proxy leaves (label
// steelyard.io/kube-proxy=false, its DaemonSet's NotIn affinity) and
// `kube-proxy --cleanup` runs there in a one-shot pod; then back, the
// other way round, with `steelyard cleanup`. Not one new connection may
// fail, every established connection must carry a request each second
// throughout, no kube-proxy rule may be left on a node steelyard took over
// (iptables-save of both flavours and families, nft list tables, against
// the node before kube-proxy first ran: kubelet's own KUBE- chains stay)
// and steelyard verify must pass there; on the way back no steelyard rule
// may be left. The cluster is left as the suite found it.
func TestMultiNodeMigrateKubeProxy(t *testing.T) {
	tar, err := cluster.KubeProxyImageTar()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tar); err != nil {
		t.Fatalf("kube-proxy image: %v (scripts/node/images.sh builds it; make multinode runs it)", err)
	}
	t0 := time.Now()
	if err := node.ImportImage(t.Context(), tar); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s imported on %d nodes in %v", cluster.KubeProxyImage, len(node.Nodes), time.Since(t0).Round(time.Millisecond))
	apply(t, spreadDeployment("mn-mig", 3))
	waitReady(t, "app=mn-mig", 3, 2*time.Minute)
	waitSliceReady(t, "mn-mig", 3, time.Minute)
	// kubelet's own KUBE- chains, before kube-proxy ever ran here.
	baseline := map[string][]string{}
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
		baseline[n.Name] = rulesOn(n).kube
		t.Logf("node %s before kube-proxy: %d KUBE- lines (kubelet's): %q", n.Name, len(baseline[n.Name]), baseline[n.Name])
	}
	modes := strings.Split(os.Getenv("STEELYARD_MIGRATE_MODES"), ",")
	if modes[0] == "" {
		modes = []string{"iptables"}
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { migrate(t, mode, baseline) })
	}
}

// migrate is one run of TestMultiNodeMigrateKubeProxy with kube-proxy and
// steelyard in mode.
func migrate(t *testing.T, mode string, baseline map[string][]string) {
	vip := clusterIP(t, "mn-mig")
	nodePort := nodePortOf(t, "mn-mig")
	kpFile := writeTemp(t, "kube-proxy.yaml", cluster.KubeProxyManifests(mode, node.NodeIP.String(), node.APIPort))
	t.Cleanup(func() { restoreSteelyard(t, kpFile, baseline) })

	// The cluster as users have it: kube-proxy's DaemonSet on every node,
	// no steelyard (its DaemonSet deleted, its rules removed).
	t0 := time.Now()
	kubectl(t, "apply", "-f", kpFile)
	kubectl(t, "-n", "kube-system", "rollout", "status", "ds/kube-proxy", "--timeout=3m")
	for _, n := range node.Nodes {
		waitKubeProxySynced(t, n, vip.Addr(), time.Minute)
	}
	kubectl(t, "-n", "steelyard", "delete", "ds", "steelyard", "--wait=true", "--timeout=2m")
	for _, n := range node.Nodes {
		waitNoPod(t, "steelyard", "app.kubernetes.io/name=steelyard", n.Name, 2*time.Minute)
	}
	if err := onEveryNode(func(n *cluster.Node) error {
		_, err := runOnce(t.Context(), "steelyard-cleanup-"+n.Name, "kube-system", n.Name, cluster.SteelyardImage,
			"/bin/sh", "-c", "steelyard cleanup --mode iptables && steelyard cleanup --mode nftables")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, n := range node.Nodes {
		if r := rulesOn(n); len(r.steelyard)+len(r.steelyardTables) != 0 || !r.kubeProxyHas(vip.Addr()) {
			t.Fatalf("node %s: steelyard's rules %q %q left, or kube-proxy's rules without %s", n.Name, r.steelyard, r.steelyardTables, vip.Addr())
		}
	}
	t.Logf("kube-proxy (%s mode) on every node, steelyard gone, in %v", mode, time.Since(t0).Round(time.Second))

	sources := serviceLoadSources(t, vip, nodePort)

	// There: steelyard beside kube-proxy on one node, then kube-proxy
	// out and its rules removed, node after node.
	held := holdConnections(t, sources, "through kube-proxy")
	asking := keepAsking(held)
	stop := load(t, sources)
	t0 = time.Now()
	// kube-proxy's DaemonSet learns to leave nodes labelled
	// steelyard.io/kube-proxy=false (its pods roll once).
	kubectl(t, "-n", "kube-system", "patch", "ds", "kube-proxy", "-p", cluster.KubeProxyAffinityPatch)
	kubectl(t, "-n", "kube-system", "rollout", "status", "ds/kube-proxy", "--timeout=3m")
	for _, n := range node.Nodes {
		waitKubeProxySynced(t, n, vip.Addr(), time.Minute)
	}
	t.Logf("kube-proxy's DaemonSet patched and rolled in %v", time.Since(t0).Round(time.Second))
	installSteelyardSelected(t, mode)
	var there []string
	for _, n := range node.Nodes {
		t1 := time.Now()
		kubectl(t, "label", "node", n.Name, cluster.LabelRunSteelyard+"=true", "--overwrite")
		waitSteelyardReadyOn(t, n.Name, 3*time.Minute)
		waitVerifyModeOn(t, n.Name, mode, time.Minute)
		ready := time.Since(t1)
		// No pod range given: the agent took clusterCIDR from
		// kube-proxy's ConfigMap.
		wantLocalDetection(t, steelyardPodOn(t, n.Name), "ClusterCIDR", cluster.PodCIDR)
		kubectl(t, "label", "node", n.Name, cluster.LabelRunKubeProxy+"=false", "--overwrite")
		waitNoPod(t, "kube-system", "k8s-app=kube-proxy", n.Name, 2*time.Minute)
		out, err := runOnce(t.Context(), "kube-proxy-cleanup-"+n.Name, "kube-system", n.Name, cluster.KubeProxyImage,
			"/usr/local/bin/kube-proxy", "--cleanup", "--v=2")
		if err != nil {
			stop()
			t.Fatalf("node %s: kube-proxy --cleanup: %v", n.Name, err)
		}
		if out = strings.TrimSpace(out); out != "" && n == node.Nodes[0] {
			t.Logf("node %s: kube-proxy --cleanup said:\n%s", n.Name, lastLines(out, 15))
		}
		left, kubelets := kubeProxyLeftovers(rulesOn(n), baseline[n.Name])
		if len(left) != 0 {
			t.Errorf("node %s: kube-proxy's rules left after kube-proxy --cleanup: %q\n%s", n.Name, left, out)
		}
		if n == node.Nodes[0] {
			t.Logf("node %s: left by design (kubelet's chain, created by kube-proxy where kubelet had not, empty): %q", n.Name, kubelets)
		}
		waitVerifyModeOn(t, n.Name, mode, 30*time.Second)
		there = append(there, fmt.Sprintf("%s %.1fs (steelyard verified after %.1fs)", n.Name, time.Since(t1).Seconds(), ready.Seconds()))
		t.Logf("node %s: steelyard verified %.1fs after its label, kube-proxy gone and cleaned up, no kube-proxy rule left, at %.1fs",
			n.Name, ready.Seconds(), time.Since(t1).Seconds())
	}
	took := time.Since(t0)
	time.Sleep(3 * time.Second)
	summary(t, fmt.Sprintf("kube-proxy (%s) to steelyard (%s)", mode, mode), took, there, sources, stop(), asking())

	// And back: kube-proxy returns beside steelyard, steelyard leaves and
	// its rules go, node after node. The connections opened before the
	// migration stay open, new ones are opened through steelyard.
	held = append(held, holdConnections(t, sources, "through steelyard")...)
	asking = keepAsking(held)
	stop = load(t, sources)
	t0 = time.Now()
	var back []string
	for _, n := range node.Nodes {
		t1 := time.Now()
		kubectl(t, "label", "node", n.Name, cluster.LabelRunKubeProxy+"-")
		waitKubeProxySynced(t, n, vip.Addr(), 2*time.Minute)
		ready := time.Since(t1)
		kubectl(t, "label", "node", n.Name, cluster.LabelRunSteelyard+"-")
		waitNoPod(t, "steelyard", "app.kubernetes.io/name=steelyard", n.Name, 2*time.Minute)
		out, err := runOnce(t.Context(), "steelyard-cleanup-"+n.Name, "kube-system", n.Name, cluster.SteelyardImage,
			"/usr/local/bin/steelyard", "cleanup", "--mode", mode)
		if err != nil {
			stop()
			t.Fatalf("node %s: steelyard cleanup: %v", n.Name, err)
		}
		if r := rulesOn(n); len(r.steelyard)+len(r.steelyardTables) != 0 || !r.kubeProxyHas(vip.Addr()) {
			t.Errorf("node %s: after steelyard cleanup, steelyard's rules %q %q, kube-proxy's have %s: %v\n%s",
				n.Name, r.steelyard, r.steelyardTables, vip.Addr(), r.kubeProxyHas(vip.Addr()), out)
		}
		back = append(back, fmt.Sprintf("%s %.1fs (kube-proxy synced after %.1fs)", n.Name, time.Since(t1).Seconds(), ready.Seconds()))
		t.Logf("node %s: kube-proxy synced %.1fs after its label, steelyard gone and cleaned up, no steelyard rule left, at %.1fs",
			n.Name, ready.Seconds(), time.Since(t1).Seconds())
	}
	took = time.Since(t0)
	time.Sleep(3 * time.Second)
	summary(t, fmt.Sprintf("steelyard (%s) back to kube-proxy (%s)", mode, mode), took, back, sources, stop(), asking())
}

// summary fails the test for each failed new connection or established
// connection lost, and logs one line with the figures of the direction.
func summary(t *testing.T, what string, took time.Duration, perNode []string, sources []loadSource, tallies []*tally, held []heldResult) {
	t.Helper()
	total := noFailures(t, what, sources, tallies)
	failed := 0
	for _, r := range tallies {
		failed += r.fails
	}
	kept := 0
	for _, h := range held {
		if h.err != nil {
			t.Errorf("%s: established connection %s lost after %d requests: %v", what, h.who, h.requests, h.err)
			continue
		}
		kept++
	}
	t.Logf("MIGRATION %s: %d nodes in %v, %d new connections, %d failed, %d of %d established connections kept; per node: %s; load average %s",
		what, len(perNode), took.Round(time.Second), total, failed, kept, len(held), strings.Join(perNode, ", "), loadavg())
}

// held is a keep-alive connection opened before a step, asked for
// /hostname every second; each answer must come from the pod of the
// first.
type held struct {
	who string
	ask func() (string, error)
	pod string
}

// heldResult is what one held connection went through.
type heldResult struct {
	who      string
	requests int
	err      error
}

// holdConnections opens one keep-alive connection from each source and
// takes its first answer.
func holdConnections(t *testing.T, sources []loadSource, via string) []*held {
	t.Helper()
	var out []*held
	for _, s := range sources {
		c, err := dialIn(s.ns, s.dst, 5*time.Second)
		if err != nil {
			t.Fatalf("%s to %s: %v", s.who, s.dst, err)
		}
		t.Cleanup(func() { c.Close() })
		h := &held{who: fmt.Sprintf("%s to %s (opened %s)", s.who, s.dst, via)}
		h.ask = func() (string, error) {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			return getHostname(c, "keep-alive")
		}
		if h.pod, err = h.ask(); err != nil {
			t.Fatalf("%s: first request: %v", h.who, err)
		}
		out = append(out, h)
	}
	return out
}

// keepAsking sends a request on every held connection each second until
// the returned function is called, which returns what each went through
// (the first error ends a connection's requests).
func keepAsking(conns []*held) (stop func() []heldResult) {
	res := make([]heldResult, len(conns))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i, h := range conns {
		res[i].who = h.who
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				got, err := h.ask()
				res[i].requests++
				if err == nil && got != h.pod {
					err = fmt.Errorf("answered by %s, opened to %s", got, h.pod)
				}
				if err != nil {
					res[i].err = err
					return
				}
			}
		}()
	}
	var once sync.Once
	return func() []heldResult {
		once.Do(func() { close(done) })
		wg.Wait()
		return res
	}
}

// installSteelyardSelected installs steelyard from manifests/ as the
// migration does: the namespace, RBAC and configuration as they are (MODE
// set to mode), the DaemonSet with the nodeSelector
// steelyard.io/steelyard=true, so it runs on no node yet.
func installSteelyardSelected(t *testing.T, mode string) {
	t.Helper()
	dir := manifestsDir()
	kubectl(t, "apply", "-f", dir+"/00-namespace.yaml", "-f", dir+"/10-rbac.yaml", "-f", dir+"/20-config.yaml")
	kubectl(t, "-n", "steelyard", "patch", "configmap", "steelyard-config", "--type=merge", "-p", fmt.Sprintf(`{"data":{"MODE":%q}}`, mode))
	ds := kubectl(t, "patch", "--local", "-f", dir+"/30-daemonset.yaml", "--type=merge", "-o", "yaml",
		"-p", fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{%q:"true"}}}}}`, cluster.LabelRunSteelyard))
	kubectl(t, "apply", "-f", writeTemp(t, "steelyard-ds.yaml", ds))
}

// restoreSteelyard leaves the cluster as the suite expects it: steelyard
// from manifests/ on every node (no nodeSelector, the default MODE, the
// pod ranges from the Nodes again: kube-proxy's ConfigMap is gone first),
// kube-proxy's objects deleted and its rules removed, no migration label.
func restoreSteelyard(t *testing.T, kpFile string, baseline map[string][]string) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	t0 := time.Now()
	run := func(args ...string) {
		if out, err := node.Kubectl(ctx, args...); err != nil {
			t.Errorf("restore: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// kube-proxy's objects first (its rules stay until its cleanup):
	// steelyard must start without kube-proxy's ConfigMap.
	run("delete", "-f", kpFile, "--ignore-not-found", "--wait=true", "--timeout=2m")
	for _, n := range node.Nodes {
		for deadline := time.Now().Add(time.Minute); podsOn("kube-system", "k8s-app=kube-proxy", n.Name) > 0 && time.Now().Before(deadline); {
			time.Sleep(500 * time.Millisecond)
		}
	}
	run("apply", "-f", manifestsDir())
	run("-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=4m")
	if err := onEveryNode(func(n *cluster.Node) error {
		_, err := runOnce(ctx, "kube-proxy-cleanup-"+n.Name, "kube-system", n.Name, cluster.KubeProxyImage,
			"/usr/local/bin/kube-proxy", "--cleanup")
		return err
	}); err != nil {
		t.Errorf("restore: %v", err)
	}
	run("label", "nodes", "--all", cluster.LabelRunSteelyard+"-", cluster.LabelRunKubeProxy+"-")
	for _, n := range node.Nodes {
		if left, _ := kubeProxyLeftovers(rulesOn(n), baseline[n.Name]); len(left) != 0 {
			t.Errorf("restore: node %s: kube-proxy's rules left: %q", n.Name, left)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			out, err := node.Kubectl(ctx, "-n", "steelyard", "exec", "ds/steelyard", "-c", "steelyard", "--", "steelyard", "verify")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("restore: steelyard verify: %v\n%s", err, out)
				break
			}
		}
	}
	t.Logf("restored: steelyard from manifests/ on every node, kube-proxy removed, in %v", time.Since(t0).Round(time.Second))
}

// kubeProxyLeftovers returns what kube-proxy left in r: every KUBE-
// line the node did not have before kube-proxy ran (baseline) and every
// kube-proxy nftables table, except kubelet's KUBE-FIREWALL where kube-proxy
// created it and left it empty (kubelets): kube-proxy ensures the chains
// of kubelet it relies on and, by design, never deletes them (kubelet
// owns them); kubelet here makes only the IPv4 one, so the ip6tables
// KUBE-FIREWALL, empty, and its jumps from INPUT and OUTPUT remain. A rule
// inside it would count as left.
func kubeProxyLeftovers(r nodeRules, baseline []string) (left, kubelets []string) {
	for _, l := range r.kube {
		if slices.Contains(baseline, l) {
			continue
		}
		_, rule, _ := strings.Cut(l, "filter: ")
		switch rule {
		case ":KUBE-FIREWALL -", "-A INPUT -j KUBE-FIREWALL", "-A OUTPUT -j KUBE-FIREWALL":
			kubelets = append(kubelets, l)
			continue
		}
		left = append(left, l)
	}
	return append(left, cluster.KubeProxyTables(r.tables)...), kubelets
}

// nodeRules is what one node's kernel holds of kube-proxy and steelyard.
type nodeRules struct {
	// kube are the KUBE- lines of iptables-save and ip6tables-save, both
	// flavours (cluster.KubeRules, prefixed with the command).
	kube []string
	// steelyard are the STEELYARD lines of the same.
	steelyard []string
	// tables are nft's tables ("ip kube-proxy"), steelyardTables those
	// of steelyard's nftables mode.
	tables, steelyardTables []string
	// kubeProxyTable is `nft list table ip kube-proxy`.
	kubeProxyTable string
}

// kubeProxyHas reports whether kube-proxy's rules name vip (its first
// sync with the test's Service is in the kernel).
func (r nodeRules) kubeProxyHas(vip netip.Addr) bool {
	for _, l := range r.kube {
		if strings.Contains(l, " -d "+vip.String()+"/32 ") {
			return true
		}
	}
	return strings.Contains(r.kubeProxyTable, vip.String())
}

// rulesOn reads node n's rules in its network namespace.
func rulesOn(n *cluster.Node) nodeRules {
	var r nodeRules
	for _, cmd := range []string{"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"} {
		out, err := n.NS.Exec(cmd)
		if err != nil {
			continue
		}
		for _, l := range cluster.KubeRules(out) {
			r.kube = append(r.kube, cmd+": "+l)
		}
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "STEELYARD") {
				r.steelyard = append(r.steelyard, cmd+": "+l)
			}
		}
	}
	if out, err := n.NS.Exec("nft", "list", "tables"); err == nil {
		r.tables = cluster.NFTTables(out)
		for _, tb := range r.tables {
			if strings.HasSuffix(tb, " steelyard") {
				r.steelyardTables = append(r.steelyardTables, tb)
			}
		}
	}
	if slices.Contains(r.tables, "ip kube-proxy") {
		r.kubeProxyTable, _ = n.NS.Exec("nft", "list", "table", "ip", "kube-proxy")
	}
	return r
}

// waitKubeProxySynced waits until kube-proxy's pod on n runs and its
// rules name vip.
func waitKubeProxySynced(t *testing.T, n *cluster.Node, vip netip.Addr, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if podsOn("kube-system", "k8s-app=kube-proxy", n.Name) > 0 && rulesOn(n).kubeProxyHas(vip) {
			return
		}
		if time.Now().After(deadline) {
			out, _ := node.Kubectl(t.Context(), "-n", "kube-system", "logs", "-l", "k8s-app=kube-proxy", "--tail=20", "--prefix")
			t.Fatalf("node %s: kube-proxy's rules without %s after %v\n%s", n.Name, vip, timeout, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// podsOn counts the pods of selector in namespace on node name, those
// terminating too.
func podsOn(namespace, selector, name string) int {
	pods, err := node.Client().CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: selector, FieldSelector: "spec.nodeName=" + name,
	})
	if err != nil {
		return -1
	}
	return len(pods.Items)
}

// waitSteelyardReadyOn waits until the DaemonSet's pod on node name is
// Ready (its first sync is in the kernel). Not rollout status: right after
// a node label it may still see the DaemonSet's status from before.
func waitSteelyardReadyOn(t *testing.T, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pods, err := node.Client().CoreV1().Pods("steelyard").List(t.Context(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=steelyard", FieldSelector: "spec.nodeName=" + name,
		})
		if err == nil {
			for _, p := range pods.Items {
				for _, c := range p.Status.Conditions {
					if p.DeletionTimestamp == nil && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						return
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: no Ready steelyard pod after %v (%v)", name, timeout, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitVerifyModeOn is waitVerifyOn for an agent in mode: `steelyard
// verify` reads the kernel of the mode it is given (the DaemonSet gives
// the agent its MODE, not a shell in its pod).
func waitVerifyModeOn(t *testing.T, name, mode string, timeout time.Duration) {
	t.Helper()
	p := steelyardPodOn(t, name)
	deadline := time.Now().Add(timeout)
	for {
		out, err := node.Kubectl(t.Context(), "-n", "steelyard", "exec", p.Name, "-c", "steelyard", "--", "steelyard", "verify", "--mode="+mode)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: steelyard verify --mode=%s after %v: %v\n%s", name, mode, timeout, err, out)
		}
		time.Sleep(time.Second)
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// waitNoPod waits until no pod of selector in namespace is left on node
// name (its DaemonSet no longer selects the node).
func waitNoPod(t *testing.T, namespace, selector, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for podsOn(namespace, selector, name) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("node %s: pods %s/%s still there after %v", name, namespace, selector, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// runOnce runs argv in a cluster.OneShotPod on node nodeName, waits until
// it has ended, deletes it and returns its log; an error when it failed.
func runOnce(ctx context.Context, name, namespace, nodeName, image string, argv ...string) (string, error) {
	f, err := os.CreateTemp("", "steelyard-oneshot-*.yaml")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(cluster.OneShotPod(name, namespace, nodeName, image, argv...)); err != nil {
		return "", err
	}
	f.Close()
	if out, err := node.Kubectl(ctx, "apply", "-f", f.Name()); err != nil {
		return out, err
	}
	defer func() {
		_, _ = node.Kubectl(context.Background(), "-n", namespace, "delete", "pod", name, "--wait=false")
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p, err := node.Client().CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed") {
			logs, _ := node.Kubectl(ctx, "-n", namespace, "logs", name)
			if p.Status.Phase == "Failed" {
				return logs, fmt.Errorf("pod %s on %s: %s failed:\n%s", name, nodeName, strings.Join(argv, " "), logs)
			}
			return logs, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("pod %s on %s: not done after 2m (%v)", name, nodeName, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// onEveryNode runs f for every node at once and joins their errors.
func onEveryNode(f func(n *cluster.Node) error) error {
	errs := make([]error, len(node.Nodes))
	var wg sync.WaitGroup
	for i, n := range node.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(n); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", n.Name, err)
			}
		}()
	}
	wg.Wait()
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%s", strings.Join(msgs, "; "))
	}
	return nil
}

// writeTemp writes content to a file of the test's temporary directory.
func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	f := t.TempDir() + "/" + name
	if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}
