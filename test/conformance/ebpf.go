package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// The steelyard-ebpf proxy: the chart with mode ebpf (manifests/ is the
// chart's default render and carries none of the ebpf mounts), rendered
// by steelyard-chart template with the cluster's cgroup of the unified
// hierarchy as ebpf.cgroupPath, its DaemonSet's cgroup mount given the
// subPathExpr that picks each node's own cgroup (UnifiedCgroupMount), and
// applied like manifests/ (cluster.Install). Each node's bpffs is its own
// (the harness mounts one per node mount namespace), at the chart's
// default ebpf.pinDir.
const ebpfProxy = "steelyard-ebpf"

// ebpfPinDir is the chart's default ebpf.pinDir, in each node's bpffs.
const ebpfPinDir = "/sys/fs/bpf/steelyard"

// ebpfHooks is the number of socket programs the agent attaches to its
// cgroup (connect, sendmsg, recvmsg and getpeername, each for IPv4 and
// IPv6: dataplane/ebpf/kernel.go's hooks), as TestHelmEBPFModeOnNode
// counts them.
const ebpfHooks = 8

// ebpfValues are the chart values of the steelyard-ebpf proxy: mode ebpf
// on the cgroup directory cgroupPath (a hostPath; the subPathExpr of the
// mount narrows it to each node's).
func ebpfValues(cgroupPath string) []string {
	return []string{"mode=ebpf", "ebpf.cgroupPath=" + cgroupPath}
}

// renderEBPF writes the steelyard-ebpf proxy's objects into dir: the chart
// rendered with ebpfValues, the DaemonSet's cgroup mount narrowed to each
// node's cgroup before anything is applied (applied first and patched
// after, the first agents would attach to the cgroup of every node).
func renderEBPF(ctx context.Context, cfg config, c *cluster.Cluster, dir string) error {
	host, sub, err := c.UnifiedCgroupMount()
	if err != nil {
		return err
	}
	args := []string{"template", "-chart", cfg.chart, "-out", dir}
	for _, v := range ebpfValues(host) {
		args = append(args, "-set", v)
	}
	if out, err := exec.CommandContext(ctx, cfg.chartBin, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", cfg.chartBin, strings.Join(args, " "), err, out)
	}
	if sub == "" {
		return nil // one node: its cgroup is the hostPath
	}
	f := filepath.Join(dir, "30-daemonset.yaml")
	b, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	if b, err = perNodeCgroup(b, sub); err != nil {
		return fmt.Errorf("%s: %w", f, err)
	}
	return os.WriteFile(f, b, 0o644)
}

// perNodeCgroup returns the DaemonSet ds (YAML) with subPathExpr on the
// agent container's volume mount named cgroup, which must be the mount of
// a hostPath volume of that name and the directory --cgroup-path names
// (the chart's contract, test/chart's TestTemplate).
func perNodeCgroup(ds []byte, subPathExpr string) ([]byte, error) {
	var d appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(ds, &d); err != nil {
		return nil, err
	}
	spec := &d.Spec.Template.Spec
	hostPath := false
	for _, v := range spec.Volumes {
		hostPath = hostPath || v.Name == "cgroup" && v.HostPath != nil
	}
	if !hostPath {
		return nil, errors.New("no hostPath volume named cgroup (rendered without mode=ebpf?)")
	}
	for i := range spec.Containers {
		ct := &spec.Containers[i]
		if ct.Name != "steelyard" {
			continue
		}
		for j := range ct.VolumeMounts {
			m := &ct.VolumeMounts[j]
			if m.Name != "cgroup" {
				continue
			}
			if !slices.Contains(ct.Args, "--cgroup-path="+m.MountPath) {
				return nil, fmt.Errorf("the agent's args %q do not name the cgroup mount %s", ct.Args, m.MountPath)
			}
			if m.SubPath != "" || m.SubPathExpr != "" {
				return nil, fmt.Errorf("the cgroup mount has a subPath already: %+v", *m)
			}
			m.SubPathExpr = subPathExpr
			out, err := yaml.Marshal(&d)
			if err != nil {
				return nil, err
			}
			return append([]byte("# steelyard-chart template (mode ebpf), the cgroup mount narrowed to each node's cgroup by test/conformance/ebpf.go\n"), out...), nil
		}
	}
	return nil, errors.New("the steelyard container has no volume mount named cgroup")
}

// checkEBPF checks, before the suite runs, that each node's socket
// programs see that node's sockets and no other's: the ebpfHooks programs
// attached to the node's own cgroup and none to the cluster's (the parent
// of every node's, on several nodes), pins in the node's own bpffs, and
// the node's agent, a hostNetwork pod like the e2e tests' host-network
// clients, in a cgroup under its node's (runc puts every pod there,
// hostNetwork or not). What it found goes to dir/ebpf.txt.
func checkEBPF(ctx context.Context, c *cluster.Cluster, dir string) error {
	var report []string
	defer func() {
		_ = os.WriteFile(filepath.Join(dir, "ebpf.txt"), []byte(strings.Join(report, "\n")+"\n"), 0o644)
	}()
	agents, err := agentContainers(ctx, c)
	if err != nil {
		return err
	}
	for _, n := range c.Nodes {
		var pins, attached []string
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
			if pins, attached, err = n.EBPFState(ctx, ebpfPinDir); err != nil {
				return err
			}
			if len(attached) == ebpfHooks || time.Now().After(deadline) || ctx.Err() != nil {
				break
			}
		}
		report = append(report, fmt.Sprintf("%s: cgroup %s: %d programs %v; %d pins under %s", n.Name, n.UnifiedCgroup(), len(attached), attached, len(pins), ebpfPinDir))
		if len(attached) != ebpfHooks || len(pins) == 0 {
			return fmt.Errorf("node %s: %d programs attached to its cgroup %s (want %d), %d pins under %s", n.Name, len(attached), n.UnifiedCgroup(), ebpfHooks, len(pins), ebpfPinDir)
		}
		id, ok := agents[n.Name]
		if !ok {
			return fmt.Errorf("node %s: no running steelyard agent", n.Name)
		}
		pid, err := n.TaskPid(ctx, id)
		if err != nil {
			return err
		}
		cg, err := n.UnifiedCgroupOf(pid)
		if err != nil {
			return err
		}
		report = append(report, fmt.Sprintf("%s: the agent (hostNetwork) runs in %s", n.Name, cg))
		if !strings.HasPrefix(cg, n.UnifiedCgroup()+"/") {
			return fmt.Errorf("node %s: its agent, a hostNetwork pod, runs in %s, outside the node's cgroup %s: the socket programs would not see hostNetwork pods", n.Name, cg, n.UnifiedCgroup())
		}
	}
	if host, sub, err := c.UnifiedCgroupMount(); err != nil {
		return err
	} else if sub != "" {
		above, err := cluster.AttachedPrograms(ctx, host)
		if err != nil {
			return err
		}
		report = append(report, fmt.Sprintf("the cluster's cgroup %s: %d programs %v", host, len(above), above))
		if len(above) > 0 {
			return fmt.Errorf("programs attached to the cluster's cgroup %s, the parent of every node's: %v", host, above)
		}
	}
	return nil
}

// agentContainers returns the steelyard container's ID of the running
// agent on each node, by node name (a pod of the last rollout still
// terminating has a third field, its deletionTimestamp, and is left out).
func agentContainers(ctx context.Context, c *cluster.Cluster) (map[string]string, error) {
	out, err := c.Kubectl(ctx, "-n", "steelyard", "get", "pods", "-l", "app.kubernetes.io/name=steelyard", "--field-selector=status.phase=Running",
		"-o", `jsonpath={range .items[*]}{.spec.nodeName} {.status.containerStatuses[?(@.name=="steelyard")].containerID} {.metadata.deletionTimestamp}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	ids := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 {
			ids[f[0]] = f[1]
		}
	}
	return ids, nil
}
