package cluster

import (
	"context"
	"encoding/json"
	"fmt"
)

// Install does what the README's "Try it on a real node" says: apply
// manifests/ (and any further folders, e.g. manifests/ingress/), give the
// agent the API server's address (the kubernetes Service's VIP needs
// steelyard itself), set the pod CIDR, append agentArgs to the agent's
// arguments (the documented opt-ins such as --ingress), roll the DaemonSet
// and wait for it.
func (c *Cluster) Install(ctx context.Context, dirs []string, agentArgs ...string) error {
	steps := [][]string{}
	for _, d := range dirs {
		steps = append(steps, []string{"apply", "-f", d})
	}
	steps = append(steps,
		[]string{"-n", "steelyard", "create", "configmap", "steelyard-apiserver",
			"--from-literal=KUBERNETES_SERVICE_HOST=" + c.NodeIP.String(),
			fmt.Sprintf("--from-literal=KUBERNETES_SERVICE_PORT=%d", c.APIPort)},
		[]string{"-n", "steelyard", "patch", "configmap", "steelyard-config", "--type=merge",
			"-p", `{"data":{"CLUSTER_CIDR":"` + PodCIDR.String() + `"}}`},
	)
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
