package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
)

// Install does what the README's "Try it on a real node" says: apply
// each of dirs (manifests/, and further folders such as manifests/ingress/),
// give the agent the API server's address (the kubernetes Service's VIP
// needs steelyard itself), set the extra keys of config (steelyard-config,
// for example MODE; no CLUSTER_CIDR: the agent reads each node's pod range,
// --detect-local-mode=NodeCIDR), apply each dir's documented
// DaemonSet patches (dir/patch/*.json, such as manifests/ingress/patch/
// ingress-on.json: --ingress and nginx's capabilities), append agentArgs
// to the agent's arguments, roll the DaemonSet
// and wait for it.
func (c *Cluster) Install(ctx context.Context, dirs []string, config map[string]string, agentArgs ...string) error {
	var steps [][]string
	for _, d := range dirs {
		steps = append(steps, []string{"apply", "-f", d})
	}
	steps = append(steps,
		[]string{"-n", "steelyard", "create", "configmap", "steelyard-apiserver",
			"--from-literal=KUBERNETES_SERVICE_HOST=" + c.NodeIP.String(),
			fmt.Sprintf("--from-literal=KUBERNETES_SERVICE_PORT=%d", c.APIPort)},
	)
	if len(config) > 0 {
		patch, err := json.Marshal(map[string]map[string]string{"data": config})
		if err != nil {
			return err
		}
		steps = append(steps, []string{"-n", "steelyard", "patch", "configmap", "steelyard-config", "--type=merge", "-p", string(patch)})
	}
	for _, d := range dirs {
		patches, _ := filepath.Glob(filepath.Join(d, "patch", "*.json"))
		for _, p := range patches {
			steps = append(steps, []string{"-n", "steelyard", "patch", "ds", "steelyard", "--type=json", "--patch-file", p})
		}
	}
	if len(agentArgs) > 0 {
		steps = append(steps, AddAgentArgs(agentArgs...))
	}
	steps = append(steps,
		[]string{"-n", "steelyard", "rollout", "restart", "ds/steelyard"},
		[]string{"-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=3m"},
	)
	for _, s := range steps {
		if _, err := c.Kubectl(ctx, s...); err != nil {
			return err
		}
	}
	return nil
}

// AddAgentArgs is the kubectl command (without "kubectl") that appends
// args to the steelyard container's arguments, as manifests/ingress/
// documents for --ingress.
func AddAgentArgs(args ...string) []string {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value string `json:"value"`
	}
	var ops []op
	for _, a := range args {
		ops = append(ops, op{"add", "/spec/template/spec/containers/0/args/-", a})
	}
	b, _ := json.Marshal(ops)
	return []string{"-n", "steelyard", "patch", "ds", "steelyard", "--type=json", "-p", string(b)}
}

// KubeProxyHealthz is where StartKubeProxy's kube-proxy serves /healthz
// (its default, 0.0.0.0:10256 inside the node namespace).
const KubeProxyHealthz = "0.0.0.0:10256"

// StartKubeProxy runs the kube-proxy of the control-plane cache on every
// node, as a process in that node's network and mount namespaces (like
// kubelet, so its rules, sysctls and xtables lock are the node's), in mode
// ("iptables" or "nftables"), and waits for each /healthz. maxPerCore and
// min are zero: kube-proxy then leaves nf_conntrack_max and the hashsize
// (host-wide values) alone; the TCP timeouts are its defaults (24h, 1h),
// which it writes in the node's network namespace, their scope. Each
// node's log is kube-proxy.log in its Dir. Stop ends them with the nodes.
func (c *Cluster) StartKubeProxy(ctx context.Context, mode string) error {
	for _, n := range c.Nodes {
		if err := n.startKubeProxy(ctx, mode); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

func (n *Node) startKubeProxy(ctx context.Context, mode string) error {
	c := n.c
	cfg := filepath.Join(n.Dir, "kube-proxy.yaml")
	doc := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
hostnameOverride: %q
mode: %q
clusterCIDR: %q
healthzBindAddress: %q
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
`, c.CP.Kubeconfig, n.Name, mode, c.ClusterCIDRs(), KubeProxyHealthz)
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		return err
	}
	kp := filepath.Join(filepath.Dir(c.Binaries.KubeControllerManager), "kube-proxy")
	p, err := controlplane.StartComponent("kube-proxy", "nsenter", n.inNode(kp, "--config="+cfg, "--v=1"),
		filepath.Join(n.Dir, "kube-proxy.log"))
	if err != nil {
		return err
	}
	c.add(p)
	if err := joinCgroup(n.cgroup+"/runtime", p.Pid()); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		code, _, err := n.NS.HTTPGet("http://127.0.0.1:10256/healthz", 2*time.Second)
		if err == nil && code == http.StatusOK {
			n.logf("kube-proxy (%s mode) healthy", mode)
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("kube-proxy exited: %v\n%s", p.ExitError(), p.Tail(30))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kube-proxy not healthy after 1m (last: %d %v)\n%s", code, err, p.Tail(30))
		}
		time.Sleep(500 * time.Millisecond)
	}
}
