package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// NodeNameVar is the agent container's variable that holds its node's
// name (the chart's and manifests/' NODE_NAME, from spec.nodeName): a
// volume mount's subPathExpr can name it.
const NodeNameVar = "$(NODE_NAME)"

// UnifiedCgroupMount returns how one DaemonSet gives each node's agent the
// node's own cgroup of the unified hierarchy (--mode ebpf's --cgroup-path):
// hostPath, a directory that holds every node's cgroup, and the volume
// mount's subPathExpr that picks the node's by its name. The nodes of this
// harness share the machine's one cgroup hierarchy (no cgroup namespace of
// their own, unlike a kind node), so the chart's single ebpf.cgroupPath
// cannot be every node's: with the cluster's cgroup there, each node's
// agent would attach to the parent of all nodes and see the other nodes'
// sockets. On one node its cgroup is the cluster's: hostPath is that,
// subPathExpr empty.
func (c *Cluster) UnifiedCgroupMount() (hostPath, subPathExpr string, err error) {
	if len(c.Nodes) == 0 {
		return "", "", errors.New("cluster: no node")
	}
	own := c.Nodes[0].UnifiedCgroup()
	if own == "" {
		return "", "", errors.New("cluster: no cgroup2 mount (--mode ebpf needs one)")
	}
	return cgroupMount(strings.TrimSuffix(own, "/"+c.Nodes[0].cgroup), c.cgroup, c.Nodes)
}

// cgroupMount is UnifiedCgroupMount for the cgroup2 mount point unified:
// it checks that every node's cgroup is the cluster's (one node) or the
// cluster's sub-cgroup named after the node (plan's layout), which is what
// the subPathExpr relies on.
func cgroupMount(unified, cluster string, nodes []*Node) (hostPath, subPathExpr string, err error) {
	if len(nodes) == 1 {
		if nodes[0].cgroup != cluster {
			return "", "", fmt.Errorf("cluster: node %s's cgroup %s is not the cluster's %s", nodes[0].Name, nodes[0].cgroup, cluster)
		}
		return filepath.Join(unified, cluster), "", nil
	}
	for _, n := range nodes {
		if n.cgroup != cluster+"/"+n.Name {
			return "", "", fmt.Errorf("cluster: node %s's cgroup %s is not %s/%s: a subPathExpr of its name cannot pick it", n.Name, n.cgroup, cluster, n.Name)
		}
	}
	return filepath.Join(unified, cluster), NodeNameVar, nil
}

// EBPFState returns what --mode ebpf holds on the node, read only: the
// pins under pinDir in the node's bpffs (its own mount namespace), and
// the programs attached to the node's cgroup of the unified hierarchy
// (AttachedPrograms).
func (n *Node) EBPFState(ctx context.Context, pinDir string) (pins, attached []string, err error) {
	if out, err := n.Exec(ctx, "find", pinDir); err == nil {
		pins = strings.Fields(out)
	} else if !strings.Contains(out, "No such file") {
		return nil, nil, fmt.Errorf("node %s's bpffs: %w", n.Name, err)
	}
	cg := n.UnifiedCgroup()
	if cg == "" {
		return nil, nil, errors.New("no cgroup2 mount")
	}
	attached, err = AttachedPrograms(ctx, cg)
	return pins, attached, err
}

// AttachedPrograms lists the programs attached to the cgroup v2 directory
// cgroup itself (not inherited from its parents), "attach_type:name"
// each, as bpftool cgroup show prints them.
func AttachedPrograms(ctx context.Context, cgroup string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "bpftool", "-j", "cgroup", "show", cgroup).Output()
	if err != nil {
		return nil, fmt.Errorf("bpftool cgroup show %s: %w", cgroup, err)
	}
	return parseCgroupShow(out)
}

// parseCgroupShow reads bpftool -j cgroup show's output (nothing at all
// when no program is attached).
func parseCgroupShow(out []byte) ([]string, error) {
	if len(strings.TrimSpace(string(out))) == 0 {
		return nil, nil
	}
	var progs []struct {
		Name       string `json:"name"`
		AttachType string `json:"attach_type"`
	}
	if err := json.Unmarshal(out, &progs); err != nil {
		return nil, fmt.Errorf("bpftool cgroup show: %w: %s", err, out)
	}
	var attached []string
	for _, p := range progs {
		attached = append(attached, p.AttachType+":"+p.Name)
	}
	return attached, nil
}
