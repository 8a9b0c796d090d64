package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Node is one node of the cluster: a network namespace, a private mount
// namespace, a cgroup, and its own containerd (root, state, sockets) and
// kubelet (root dir, config, pod logs).
type Node struct {
	// Name is the Node object's name.
	Name string
	// IP is its InternalIP: on the dummy interface of a one-node cluster,
	// on the node LAN (lan.go) otherwise.
	IP netip.Addr
	// Zone is its topology.kubernetes.io/zone label ("" on a one-node
	// cluster, which has none).
	Zone string
	// NS is the node's network namespace.
	NS *sandbox.NS
	// Dir holds the node's containerd, kubelet, CNI directories and logs.
	Dir string
	// CNIConfDir and CNIBinDir are the node's /etc/cni/net.d and
	// /opt/cni/bin as seen from the root mount namespace.
	CNIConfDir, CNIBinDir string
	// ContainerdSock is containerd's socket (for ctr).
	ContainerdSock string
	// PodCIDR is the node's pod range: PodCIDR for a one-node cluster,
	// else what kube-controller-manager's node IPAM gave it (valid once
	// Start returned).
	PodCIDR netip.Prefix
	// IP6 and PodCIDR6 are the node's IPv6 InternalIP and pod range on a
	// dual-stack cluster (dualstack.go); invalid otherwise.
	IP6      netip.Addr
	PodCIDR6 netip.Prefix

	c           *Cluster
	cgroup      string // cgroup path below every hierarchy's root
	mntns       string
	stopForward func()

	mu      sync.Mutex
	kubelet *controlplane.Component
}

// prepare makes the node's cgroup, CNI directories and its mount
// namespace.
func (n *Node) prepare() error {
	if err := makeCgroup(n.cgroup + "/runtime"); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	n.CNIConfDir = filepath.Join(n.Dir, "cni", "net.d")
	n.CNIBinDir = filepath.Join(n.Dir, "cni", "bin")
	nsDir := filepath.Join(n.Dir, "ns")
	for _, d := range []string{n.CNIConfDir, n.CNIBinDir, nsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range []string{"bridge", "loopback", "host-local", "portmap"} {
		if err := copyFile(filepath.Join(n.c.Binaries.CNIPluginsDir, p), filepath.Join(n.CNIBinDir, p), 0o755); err != nil {
			return err
		}
	}
	// A persistent private mount namespace: bind-mount a directory onto
	// itself, make it private (a namespace file cannot sit on a shared
	// mount), and let unshare(1) pin the namespace to a file there.
	if err := run("mount", "--bind", nsDir, nsDir); err != nil {
		return err
	}
	if err := run("mount", "--make-private", nsDir); err != nil {
		return err
	}
	n.mntns = filepath.Join(nsDir, "mnt")
	if err := os.WriteFile(n.mntns, nil, 0o644); err != nil {
		return err
	}
	if err := run("unshare", "--mount="+n.mntns, "--propagation", "private", "true"); err != nil {
		return err
	}
	script := strings.Join([]string{
		"set -e",
		"for d in /run /var/lib /var/log /opt; do mount -t tmpfs -o mode=0755,size=512m steelyard-node $d; done",
		"mkdir -p /opt/cni/bin /var/lib/cni /run/netns",
		"mount --bind " + n.CNIBinDir + " /opt/cni/bin",
		"mount --bind " + n.CNIConfDir + " /etc/cni/net.d",
		"touch /run/xtables.lock",
		// A bpffs of the node's own at /sys/fs/bpf (--mode ebpf pins its
		// maps and links there through a hostPath): a new instance in this
		// mount namespace only, so no pin reaches the machine's or another
		// node's, and the pins outlive the agent's pod as on a real node.
		"mount -t bpf -o mode=0700 steelyard-node /sys/fs/bpf",
		// Shared (a peer group of this namespace only): containerd lets a
		// hostPath with HostToContainer propagation come only from a
		// shared or slave mount, as /sys/fs/bpf is under systemd.
		"mount --make-shared /sys/fs/bpf",
	}, "\n")
	return run("nsenter", "--mount="+n.mntns, "--", "sh", "-c", script)
}

// UnifiedCgroup returns the node's cgroup in the cgroup v2 (unified)
// hierarchy, as a host path: it holds the node's containerd, kubelet and
// pods and nothing else of this machine (--mode ebpf's --cgroup-path on
// this node). Empty when the machine has no cgroup2 mount.
func (n *Node) UnifiedCgroup() string {
	hs, err := cgroupHierarchies()
	if err != nil {
		return ""
	}
	for _, h := range hs {
		var st syscall.Statfs_t
		if syscall.Statfs(h, &st) == nil && st.Type == cgroup2Magic {
			return filepath.Join(h, n.cgroup)
		}
	}
	return ""
}

// UnifiedCgroupOf returns the host path of process pid's cgroup in the
// cgroup v2 hierarchy (its /proc/<pid>/cgroup "0::" line), e.g. where runc
// put a pod's container.
func (n *Node) UnifiedCgroupOf(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	own := n.UnifiedCgroup()
	if own == "" {
		return "", fmt.Errorf("no cgroup2 mount")
	}
	mount := strings.TrimSuffix(own, "/"+n.cgroup)
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return filepath.Join(mount, p), nil
		}
	}
	return "", fmt.Errorf("pid %d: no cgroup v2 line in /proc/%d/cgroup", pid, pid)
}

// Exec runs argv in the node's network and mount namespaces (where its
// bpffs is) and returns its combined output.
func (n *Node) Exec(ctx context.Context, argv ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "nsenter", n.inNode(argv...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

// cgroup2Magic is CGROUP2_SUPER_MAGIC, statfs's type of a cgroup v2 mount.
const cgroup2Magic = 0x63677270

// writeConflist writes the node's main CNI configuration: the bridge
// plugin with host-local on the node's pod range.
func (n *Node) writeConflist() error {
	if n.c.opts.DualStack {
		return os.WriteFile(filepath.Join(n.CNIConfDir, MainConflist),
			[]byte(mainConflistRanges(n.c.opts.BridgeHairpin, []netip.Prefix{n.PodCIDR, n.PodCIDR6})), 0o644)
	}
	return os.WriteFile(filepath.Join(n.CNIConfDir, MainConflist),
		[]byte(mainConflist(n.c.opts.BridgeHairpin, n.PodCIDR, n.PodCIDR.Addr().Next())), 0o644)
}

// inNode returns the nsenter argv that runs argv in the node's network and
// mount namespaces.
func (n *Node) inNode(argv ...string) []string {
	return append([]string{"--net=" + n.NS.Path(), "--mount=" + n.mntns, "--"}, argv...)
}

func (n *Node) logf(format string, args ...any) {
	n.c.logf("cluster: node %s: "+format, append([]any{n.Name}, args...)...)
}

func (n *Node) startContainerd(ctx context.Context) error {
	dir := filepath.Join(n.Dir, "containerd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(dir, n.c.Binaries.ContainerdShimDir, n.c.Binaries.Runc)), 0o644); err != nil {
		return err
	}
	n.ContainerdSock = filepath.Join(dir, "containerd.sock")
	t0 := time.Now()
	p, err := controlplane.StartComponent("containerd", "nsenter", n.inNode(
		"env", "PATH="+n.c.Binaries.ContainerdShimDir+":/usr/sbin:/usr/bin:/sbin:/bin",
		n.c.Binaries.Containerd, "--config", cfg, "--log-level", "info",
	), filepath.Join(n.Dir, "containerd.log"))
	if err != nil {
		return err
	}
	n.c.add(p)
	// Its shims and their containers inherit the cgroup.
	if err := joinCgroup(n.cgroup+"/runtime", p.Pid()); err != nil {
		return fmt.Errorf("containerd cgroup: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := n.ctr(ctx, "version"); err == nil {
			break
		} else if time.Now().After(deadline) || !p.Running() {
			return fmt.Errorf("containerd not ready: %v; log:\n%s", err, p.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	n.logf("containerd %s ready in %v", ContainerdVersion, time.Since(t0).Round(time.Millisecond))
	return nil
}

// ctr runs ctr against the node's containerd, in its k8s.io namespace.
func (n *Node) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, n.c.Binaries.Ctr, append([]string{"--address", n.ContainerdSock, "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// importImages imports every image tarball.
func (n *Node) importImages(ctx context.Context) error {
	t0 := time.Now()
	images := append(append([]string(nil), n.c.Binaries.Images...), n.c.opts.ExtraImages...)
	for _, img := range images {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	n.logf("%d images imported in %v", len(images), time.Since(t0).Round(time.Millisecond))
	return nil
}

// ImportImage imports one docker-archive tarball into the node's
// containerd.
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	return n.ctr(ctx, "images", "import", "--local", tarball)
}

func (n *Node) startKubelet() error {
	dir := filepath.Join(n.Dir, "kubelet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	resolv := filepath.Join(n.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# no DNS in the box\n"), 0o644); err != nil {
		return err
	}
	cfg := filepath.Join(n.Dir, "kubelet.yaml")
	doc := kubeletConfig("/"+n.cgroup, n.ContainerdSock, resolv, "/var/log/pods", n.IP)
	if n.c.opts.ClusterDNS.IsValid() {
		doc += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: cluster.local\n", n.c.opts.ClusterDNS)
	}
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		return err
	}
	args := []string{
		n.c.Binaries.Kubelet,
		"--config=" + cfg,
		"--kubeconfig=" + n.c.CP.Kubeconfig,
		"--root-dir=" + dir,
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.nodeIPs(),
		"--v=1",
	}
	if n.Zone != "" {
		args = append(args, "--node-labels="+corev1.LabelTopologyZone+"="+n.Zone)
	}
	p, err := controlplane.StartComponent("kubelet", "nsenter", n.inNode(args...), filepath.Join(n.Dir, "kubelet.log"))
	if err != nil {
		return err
	}
	n.c.add(p)
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	return joinCgroup(n.cgroup+"/runtime", p.Pid())
}

// waitNode polls the Node object until done says it is what the caller
// waits for, failing when kubelet exits or the cluster's ReadyTimeout
// passes; done returns the reason to report when it is not.
func (n *Node) waitNode(ctx context.Context, what string, done func(*corev1.Node) (bool, string)) error {
	ctx, cancel := context.WithTimeout(ctx, n.c.opts.ReadyTimeout)
	defer cancel()
	client := n.c.CP.Client()
	last := "not registered"
	for {
		obj, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			var ok bool
			if ok, last = done(obj); ok {
				return nil
			}
		}
		n.mu.Lock()
		k := n.kubelet
		n.mu.Unlock()
		if !k.Running() {
			return fmt.Errorf("node %s: kubelet exited: %v", n.Name, k.ExitError())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not %s after %v: %s", n.Name, what, n.c.opts.ReadyTimeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitReady waits for the Node's Ready condition.
func (n *Node) waitReady(ctx context.Context) error {
	return n.waitNode(ctx, "Ready", func(obj *corev1.Node) (bool, string) {
		for _, cond := range obj.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, cond.Reason + ": " + cond.Message
			}
		}
		return false, "no Ready condition"
	})
}

// waitPodCIDR waits for node IPAM to give the Node its pod range and
// records it in PodCIDR (and the IPv6 one in PodCIDR6 when dual-stack).
func (n *Node) waitPodCIDR(ctx context.Context) error {
	return n.waitNode(ctx, "given a podCIDR", func(obj *corev1.Node) (bool, string) {
		var v4, v6 netip.Prefix
		for _, s := range obj.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
				v4 = p
			} else if err == nil {
				v6 = p
			}
		}
		switch {
		case !v4.IsValid():
			return false, "no IPv4 podCIDR yet"
		case n.c.opts.DualStack && !v6.IsValid():
			return false, "no IPv6 podCIDR yet"
		}
		n.PodCIDR, n.PodCIDR6 = v4, v6
		return true, ""
	})
}

// nodeIPs is kubelet's --node-ip: the InternalIP, and the IPv6 one after
// it on a dual-stack cluster (IPv4 the primary family).
func (n *Node) nodeIPs() string {
	if n.IP6.IsValid() {
		return n.IP.String() + "," + n.IP6.String()
	}
	return n.IP.String()
}

// TaskPid returns the host PID of a running container's main process on
// this node, by the containerID of a Pod's status ("containerd://<id>" or
// the bare id). Its /proc/<pid>/ns/net is the pod's network namespace.
func (n *Node) TaskPid(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := exec.CommandContext(ctx, n.c.Binaries.Ctr, "--address", n.ContainerdSock, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("ctr tasks ls: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s has no running task on node %s", id, n.Name)
}

// Kubelet returns the node's kubelet process (nil before it started).
func (n *Node) Kubelet() *controlplane.Component {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubelet
}
