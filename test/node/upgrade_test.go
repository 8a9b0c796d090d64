//go:build node

package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// helmChart runs bin/steelyard-chart (test/chart: the Helm v4 library's
// install, upgrade and uninstall, its own Go module) on the node's cluster
// with the chart of this tree, stamped with the build's VERSION.
func helmChart(ctx context.Context, args ...string) (string, error) {
	bin := os.Getenv("STEELYARD_CHART_BIN")
	if bin == "" {
		return "", fmt.Errorf("STEELYARD_CHART_BIN is not set (make node builds bin/steelyard-chart)")
	}
	full := append([]string{args[0],
		"-chart", filepath.Join(manifestsDir(), "..", "charts", "steelyard"),
		"-kubeconfig", node.CP.Kubeconfig,
		"-version", os.Getenv("STEELYARD_VERSION"),
	}, args[1:]...)
	if args[0] == "uninstall" {
		full = []string{"uninstall", "-kubeconfig", node.CP.Kubeconfig}
	}
	out, err := exec.CommandContext(ctx, bin, full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("steelyard-chart %s: %w: %s", strings.Join(full, " "), err, out)
	}
	return string(out), nil
}

// TestHelmInstallUpgradeMode: the kubectl install of manifests/ is
// replaced by the chart installed with the Helm library (the values a user
// gives: apiServer, nothing else: the pod range is the Node's); the agent runs in iptables mode and the
// kernel equals verify's desired state. Then helm upgrade --reuse-values
// --set mode=nftables under bounded load from the client pod: the
// DaemonSet rolls by itself (the config hash on its pod template), the new
// agent's nftables table equals the desired state, its first sync removes
// the iptables rules the old agent left, and not one new connection
// fails. manifests/ is put back at the end.
func TestHelmInstallUpgradeMode(t *testing.T) {
	web(t)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "web")
	cl := client(t)

	replaceWithChart(t)

	out, err := helmChart(t.Context(), "install",
		"-set", fmt.Sprintf("apiServer=%s:%d", node.NodeIP, node.APIPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install: %s", strings.TrimSpace(out))
	version := os.Getenv("STEELYARD_VERSION")
	if !strings.Contains(out, "revision 1 status deployed") || !strings.HasSuffix(strings.TrimSpace(out), " app "+version) {
		t.Errorf("helm install: %q, want revision 1 deployed with appVersion %q", out, version)
	}
	ds, err := node.Client().AppsV1().DaemonSets("steelyard").Get(t.Context(), "steelyard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Annotations["meta.helm.sh/release-name"] != "steelyard" {
		t.Errorf("the DaemonSet is not the Helm release's: annotations %v", ds.Annotations)
	}
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	verifyMode(t, "", time.Minute)
	old := steelyardPod(t)
	// No clusterCIDR given: the agent took the Node's spec.podCIDRs.
	wantLocalDetection(t, old, "NodeCIDR", cluster.PodCIDR)
	if len(steelyardRules(t)) == 0 {
		t.Fatal("iptables mode: no STEELYARD rules in the node namespace")
	}

	// Bounded load: 4 connections at a time, at most 100 a second each.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var total atomic.Int64
	r := &tally{}
	start := time.Now()
	var failMu sync.Mutex
	var failAt []string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				name, err := hostname(cl, vip)
				if err != nil {
					failMu.Lock()
					failAt = append(failAt, fmt.Sprintf("%.1fs: %v", time.Since(start).Seconds(), err))
					failMu.Unlock()
				}
				r.add(name, err)
				total.Add(1)
			}
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopLoad()

	time.Sleep(3 * time.Second)
	upAt := time.Since(start)
	out, err = helmChart(t.Context(), "upgrade", "-set", "mode=nftables")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade at %.1fs: %s", upAt.Seconds(), strings.TrimSpace(out))
	if !strings.Contains(out, "revision 2 status deployed") {
		t.Errorf("helm upgrade: %q, want revision 2 deployed", out)
	}
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	if p := steelyardPod(t); p.Name == old.Name {
		t.Fatalf("helm upgrade --set mode=nftables did not roll the DaemonSet (pod %s still runs)", p.Name)
	}
	// verify with no --mode: the DaemonSet's STEELYARD_MODE makes it the
	// agent's (nftables now), as an operator would run it.
	waitVerify(t, time.Minute)
	// The iptables rules the old agent left go once the new mode's first
	// sync is in the kernel.
	deadline := time.Now().Add(30 * time.Second)
	for left := steelyardRules(t); len(left) > 0; left = steelyardRules(t) {
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the upgrade, %d iptables rules of the old mode are left: %s", len(left), strings.Join(left[:min(5, len(left))], "; "))
		}
		time.Sleep(time.Second)
	}
	t.Logf("nftables mode in the kernel and no STEELYARD iptables rule left at %.1fs", time.Since(start).Seconds())
	time.Sleep(5 * time.Second)
	stopLoad()

	t.Logf("%d connections to %s over %v, %d failed; shares %s %.1f%%, %s %.1f%%", total.Load(), vip, time.Since(start).Round(time.Second), r.fails,
		"web-0", r.share("web-0"), "web-1", r.share("web-1"))
	if r.fails != 0 {
		t.Errorf("%d new connections failed across helm upgrade: %v\nfailures: %s", r.fails, r.errors, strings.Join(failAt, "; "))
	}
	if r.ok() < 500 {
		t.Errorf("only %d connections succeeded", r.ok())
	}
}

// replaceWithChart deletes the kubectl install of manifests/ (the rules
// stay in the kernel, so the VIPs keep working while no agent runs) for a
// test that installs the chart, and at the end uninstalls the release and
// installs manifests/ again, verified.
func replaceWithChart(t *testing.T) {
	t.Helper()
	kubectl(t, "delete", "-f", manifestsDir(), "--wait=true", "--timeout=2m")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := helmChart(ctx, "uninstall"); err != nil {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		if _, err := node.Kubectl(ctx, "wait", "--for=delete", "namespace/steelyard", "--timeout=2m"); err != nil && !strings.Contains(err.Error(), "NotFound") {
			t.Errorf("namespace steelyard not gone: %v", err)
		}
		if err := install(ctx); err != nil {
			t.Errorf("reinstall from manifests/: %v", err)
			return
		}
		// t.Context() is done by now: verify with ctx (iptables again; the
		// agent removes the nftables table the chart's agent left).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			out, err := node.Kubectl(ctx, "-n", "steelyard", "exec", "ds/steelyard", "-c", "steelyard", "--", "steelyard", "verify")
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("manifests/ back: steelyard verify after 1m: %v\n%s", err, out)
				return
			}
		}
		t.Log("manifests/ installed again with kubectl; steelyard verify: kernel equals the desired state")
	})

}
