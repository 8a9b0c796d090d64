package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Options configure Start; the zero value is ready to use.
type Options struct {
	// Nodes is the number of nodes (default 1). One node is the layout
	// the single-node suites were written for (package comment); more
	// get a node LAN (lan.go), node IPAM and three zones.
	Nodes int
	// NodeName is the Node kubelet registers (default "steelyard-node");
	// with several nodes, the prefix of their names ("steelyard-node-1",
	// "steelyard-node-2", ...).
	NodeName string
	// Logf receives progress lines.
	Logf func(format string, args ...any)
	// ReadyTimeout bounds the wait for each Node to be Ready (default 3m).
	ReadyTimeout time.Duration
	// ExtraControllers are kube-controller-manager controllers to run
	// besides Controllers (the conformance suite needs a few more).
	ExtraControllers []string
	// ExtraImages are docker-archive tarballs imported after the node's
	// own (an image of the same name replaces the node's).
	ExtraImages []string
	// ClusterDNS, when valid, is the kubelet's clusterDNS (pods resolve
	// names there, domain cluster.local); the caller runs the DNS server.
	ClusterDNS netip.Addr
	// BridgeHairpin sets the bridge plugin's hairpinMode, so a pod reaches
	// itself through a Service VIP without steelyard-cni (which turns it
	// on per port): what a node running kube-proxy needs.
	BridgeHairpin bool
	// DualStack runs both IP families (dualstack.go): IPv4 and IPv6
	// Service and pod ranges, node addresses of both families, an address
	// of each on every pod. It needs several nodes (the node LAN).
	DualStack bool
}

// Cluster is a running cluster of one or more nodes. Stop tears it all
// down.
type Cluster struct {
	// CP is etcd and kube-apiserver; CP.Kubeconfig is the admin's
	// kubeconfig (usable from the root namespace).
	CP *controlplane.ControlPlane
	// Sandbox holds the first node's namespace (Sandbox.Node), clients
	// and, with several nodes, every other namespace.
	Sandbox *sandbox.Sandbox
	// Nodes are the nodes in order; Nodes[0] is the first node, whose
	// namespace is Sandbox.Node.
	Nodes []*Node
	// LAN is the node LAN's namespace (nil on a one-node cluster).
	LAN *sandbox.NS
	// Dir holds everything else: each node's containerd root and state,
	// kubelet root, configs, logs. Stop removes it.
	Dir string
	// NodeName is the first node's name; NodeIP its InternalIP
	// (sandbox.NodeIP), kube-apiserver's advertised address.
	NodeName string
	NodeIP   netip.Addr
	// APIPort is kube-apiserver's port, on 127.0.0.1 of the root namespace
	// and relayed on every address of each node namespace.
	APIPort int
	// CNIConfDir and CNIBinDir are the first node's /etc/cni/net.d and
	// /opt/cni/bin as seen from the root mount namespace.
	CNIConfDir, CNIBinDir string
	// ContainerdSock is the first node's containerd socket (for ctr).
	ContainerdSock string
	// Binaries in use.
	Binaries Binaries

	opts         Options
	cgroup       string
	madeEtcCNI   []string
	tunablesHeld bool
	proxy        *connectProxy

	mu         sync.Mutex
	components []*controlplane.Component // start order; Stop goes in reverse
	lanClients int
	stopped    bool
}

// madeDirsFile, in Dir, lists the mount points Start created on the host.
const madeDirsFile = "made-dirs"

// ownerPrefix starts the names of this package's directories and cgroups,
// followed by the owner's PID.
const ownerPrefix = "steelyard-node-"

var (
	registryMu sync.Mutex
	registry   = map[*Cluster]bool{}
)

// StopAll stops every running cluster of this process (signal handlers).
func StopAll() {
	registryMu.Lock()
	cs := make([]*Cluster, 0, len(registry))
	for c := range registry {
		cs = append(cs, c)
	}
	registryMu.Unlock()
	for _, c := range cs {
		_ = c.Stop()
	}
}

// Start brings the cluster up: the namespaces (and the node LAN), control
// plane, controllers, then per node containerd with the images imported
// and kubelet, and waits for every Node to be Ready. On error everything
// started is torn down.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 1
	}
	if opts.Nodes < 1 || opts.Nodes > maxNodes {
		return nil, fmt.Errorf("cluster: %d nodes: want 1 to %d", opts.Nodes, maxNodes)
	}
	if opts.DualStack && opts.Nodes < 2 {
		return nil, errors.New("cluster: dual-stack needs 2 nodes or more (the node LAN carries the IPv6 addresses)")
	}
	if opts.NodeName == "" {
		opts.NodeName = "steelyard-node"
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	bins, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	removeOrphans(opts.Logf)
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", ownerPrefix, os.Getpid()))
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		Dir:      dir,
		NodeIP:   sandbox.NodeIP,
		Binaries: bins,
		opts:     opts,
		cgroup:   fmt.Sprintf("%s%d-%s", ownerPrefix, os.Getpid(), strings.TrimPrefix(filepath.Base(dir), fmt.Sprintf("%s%d-", ownerPrefix, os.Getpid()))),
	}
	c.Nodes = c.plan()
	c.NodeName = c.Nodes[0].Name
	registryMu.Lock()
	registry[c] = true
	registryMu.Unlock()
	if err := c.start(ctx); err != nil {
		logs := c.Logs(30)
		_ = c.Stop()
		return nil, fmt.Errorf("%w\n%s", err, logs)
	}
	return c, nil
}

// plan names the nodes and gives them their addresses, zones, directories
// and cgroups. One node keeps the one-node layout: Dir and the cluster's
// cgroup are its own, its pod range is PodCIDR, no zone.
func (c *Cluster) plan() []*Node {
	if c.opts.Nodes == 1 {
		return []*Node{{Name: c.opts.NodeName, IP: sandbox.NodeIP, Dir: c.Dir, PodCIDR: PodCIDR, c: c, cgroup: c.cgroup}}
	}
	var nodes []*Node
	for k := 1; k <= c.opts.Nodes; k++ {
		name := fmt.Sprintf("%s-%d", c.opts.NodeName, k)
		n := &Node{
			Name:   name,
			IP:     nodeLANIP(k),
			Zone:   zoneOf(k),
			Dir:    filepath.Join(c.Dir, "nodes", name),
			c:      c,
			cgroup: c.cgroup + "/" + name,
		}
		if c.opts.DualStack {
			n.IP6 = nodeLANIP6(k)
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func (c *Cluster) logf(format string, args ...any) { c.opts.Logf(format, args...) }

func (c *Cluster) start(ctx context.Context) error {
	t0 := time.Now()
	var err error
	c.Sandbox, err = sandbox.New(sandbox.Options{Prefix: "syn", Dir: filepath.Join(c.Dir, "sandbox"), Logf: c.opts.Logf})
	if err != nil {
		return err
	}
	c.Nodes[0].NS = c.Sandbox.Node
	if len(c.Nodes) > 1 {
		if err := c.makeLAN(); err != nil {
			return err
		}
		if c.opts.DualStack {
			if err := c.makeLAN6(); err != nil {
				return err
			}
		}
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	if err := c.startControllers(); err != nil {
		return err
	}
	if err := c.prepareHost(); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.prepare(); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if len(c.Nodes) == 1 {
			if err := n.writeConflist(); err != nil {
				return err
			}
		}
	}
	first := c.Nodes[0]
	c.CNIConfDir, c.CNIBinDir = first.CNIConfDir, first.CNIBinDir
	// One node after the other: the image imports are CPU-bound, and a
	// kubelet starts while the next node's containerd comes up.
	for _, n := range c.Nodes {
		if err := n.startContainerd(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := n.importImages(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := n.startKubelet(); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	c.ContainerdSock = first.ContainerdSock
	if len(c.Nodes) == 1 {
		// Its range is all of PodCIDR (conflist written above); the
		// wait makes spec.podCIDRs known before steelyard starts.
		if err := first.waitPodCIDR(ctx); err != nil {
			return err
		}
	} else {
		// A Node is NotReady until its CNI configuration exists, which
		// needs the pod range node IPAM gives it once registered.
		for _, n := range c.Nodes {
			if err := n.waitPodCIDR(ctx); err != nil {
				return err
			}
			if err := n.writeConflist(); err != nil {
				return err
			}
		}
		if err := c.routePodCIDRs(); err != nil {
			return err
		}
		if c.opts.DualStack {
			if err := c.routePodCIDRs6(); err != nil {
				return err
			}
		}
	}
	for _, n := range c.Nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
		c.logf("cluster: node %s (%s, pods %s%s%s) Ready after %v", n.Name, n.IP, n.PodCIDR, v6Note(n), zoneNote(n.Zone), time.Since(t0).Round(time.Millisecond))
	}
	c.logf("cluster: %d node(s) Ready in %v (dir %s, kubeconfig %s)", len(c.Nodes), time.Since(t0).Round(time.Millisecond), c.Dir, c.CP.Kubeconfig)
	return nil
}

func v6Note(n *Node) string {
	if !n.PodCIDR6.IsValid() {
		return ""
	}
	return fmt.Sprintf("; %s, pods %s", n.IP6, n.PodCIDR6)
}

func zoneNote(zone string) string {
	if zone == "" {
		return ""
	}
	return ", " + zone
}

func (c *Cluster) add(p *controlplane.Component) {
	c.mu.Lock()
	c.components = append(c.components, p)
	c.mu.Unlock()
}

// prepareHost records the host tunables kubelet will change (once for all
// the nodes), creates the cluster's cgroup and the host's /etc/cni/net.d
// mount point when missing.
func (c *Cluster) prepareHost() error {
	// One record for the machine (tunables.go); a killed owner's share is
	// pruned by the next Acquire.
	restored, err := hostStore.Acquire(filepath.Base(c.Dir))
	if len(restored) > 0 {
		c.logf("cluster: restored host tunables of a killed owner: %s", strings.Join(restored, ", "))
	}
	if err != nil {
		return fmt.Errorf("host tunables: %w", err)
	}
	c.tunablesHeld = true
	if err := makeCgroup(c.cgroup); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	// The mount point of every node's /etc/cni/net.d.
	for _, d := range []string{"/etc/cni", "/etc/cni/net.d"} {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			c.madeEtcCNI = append(c.madeEtcCNI, d)
		}
	}
	// So that the orphan clean-up of a killed owner knows them too.
	return os.WriteFile(filepath.Join(c.Dir, madeDirsFile), []byte(strings.Join(c.madeEtcCNI, "\n")), 0o644)
}

// ImportImage imports one docker-archive tarball into every node.
func (c *Cluster) ImportImage(ctx context.Context, tarball string) error {
	for _, n := range c.Nodes {
		if err := n.ImportImage(ctx, tarball); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// TaskPid returns the host PID of a running container's main process, on
// whichever node runs it; see Node.TaskPid.
func (c *Cluster) TaskPid(ctx context.Context, containerID string) (int, error) {
	var errs []error
	for _, n := range c.Nodes {
		pid, err := n.TaskPid(ctx, containerID)
		if err == nil {
			return pid, nil
		}
		errs = append(errs, err)
	}
	return 0, errors.Join(errs...)
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Client returns an admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.CP.Client() }

// Kubectl runs kubectl as the admin and returns its standard output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.CP.Binaries.Kubectl, append([]string{"--kubeconfig=" + c.CP.Kubeconfig}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Logs returns the last n lines of every component's log.
func (c *Cluster) Logs(n int) string {
	var b strings.Builder
	c.mu.Lock()
	comps := append([]*controlplane.Component(nil), c.components...)
	c.mu.Unlock()
	for _, p := range comps {
		name, err := filepath.Rel(c.Dir, p.LogPath())
		if err != nil {
			name = filepath.Base(p.LogPath())
		}
		fmt.Fprintf(&b, "--- %s, last lines:\n%s\n", name, p.Tail(n))
	}
	if c.CP != nil {
		b.WriteString(c.CP.Logs(n))
	}
	return b.String()
}

// Stop tears everything down: kubelets, then every process in the
// cluster's cgroup (containerds, shims, containers), the mount namespaces, the
// controllers, the control plane, the tunables, the namespaces, the
// directories. It may be called more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	comps := c.components
	c.mu.Unlock()
	registryMu.Lock()
	delete(registry, c)
	registryMu.Unlock()
	var errs []error
	// kubelets and containerds first (the last components), so nothing
	// restarts containers while they are killed.
	for i := len(comps) - 1; i >= 0; i-- {
		comps[i].Stop(10 * time.Second)
	}
	if err := removeCgroup(c.cgroup); err != nil {
		errs = append(errs, err)
	}
	// Every node's mount namespace file and its bind mount.
	if err := unmountUnder(c.Dir); err != nil {
		errs = append(errs, err)
	}
	for _, n := range c.Nodes {
		if n.stopForward != nil {
			n.stopForward()
		}
	}
	if c.proxy != nil {
		c.proxy.close()
	}
	if c.CP != nil {
		if err := c.CP.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.tunablesHeld {
		restored, err := hostStore.Release(filepath.Base(c.Dir))
		if err != nil {
			errs = append(errs, err)
		}
		if len(restored) > 0 {
			c.logf("cluster: restored host tunables %s", strings.Join(restored, ", "))
		}
	}
	if c.Sandbox != nil {
		if err := c.Sandbox.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	// The list on disk: another owner may have handed its own over.
	made := c.madeEtcCNI
	if b, err := os.ReadFile(filepath.Join(c.Dir, madeDirsFile)); err == nil {
		made = strings.Fields(string(b))
	}
	if !handOverMadeDirs(c.Dir, made) {
		for i := len(made) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(made[i]); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeOrphans removes what clusters of dead owners left: their cgroups
// (and the processes in them), their mounts and their directories.
func removeOrphans(logf func(string, ...any)) {
	dead := func(name string) bool {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, ownerPrefix), "-", 2)[0])
		return err == nil && pid > 0 && pid != os.Getpid() && !alive(pid)
	}
	if hs, err := cgroupHierarchies(); err == nil {
		for _, h := range hs {
			ms, _ := filepath.Glob(filepath.Join(h, ownerPrefix+"*"))
			for _, m := range ms {
				if dead(filepath.Base(m)) {
					logf("cluster: removing orphan cgroup %s", filepath.Base(m))
					_ = removeCgroup(filepath.Base(m))
				}
			}
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), ownerPrefix+"*"))
	for _, d := range dirs {
		if dead(filepath.Base(d)) {
			logf("cluster: removing orphan %s", d)
			_ = unmountUnder(d)
			if made, err := os.ReadFile(filepath.Join(d, madeDirsFile)); err == nil && !handOverMadeDirs(d, strings.Fields(string(made))) {
				dirs := strings.Fields(string(made))
				for i := len(dirs) - 1; i >= 0; i-- {
					_ = syscall.Rmdir(dirs[i]) // only if still empty
				}
			}
			_ = os.RemoveAll(d)
		}
	}
	if restored, _ := hostStore.Prune(); len(restored) > 0 {
		logf("cluster: restored host tunables of a killed owner: %s", strings.Join(restored, ", "))
	}
	_ = sandbox.RemoveLeftovers("syn", logf)
}

// handOverMadeDirs gives the host mount points self made (/etc/cni,
// /etc/cni/net.d) to another live owner's list instead of removing them:
// removing a directory detaches the mounts on it in every mount namespace,
// so a concurrent cluster bound onto it would lose its /etc/cni/net.d (seen
// here: its install-cni then waited for a conflist that had vanished). It
// reports whether some owner took them.
func handOverMadeDirs(self string, made []string) bool {
	if len(made) == 0 {
		return false
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), ownerPrefix+"*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(d), ownerPrefix), "-", 2)[0])
		if d == self || err != nil || !alive(pid) {
			continue
		}
		f := filepath.Join(d, madeDirsFile)
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		have := strings.Fields(string(b))
		for _, m := range made {
			if !slices.Contains(have, m) {
				have = append(have, m)
			}
		}
		// Outer directories first, as Start writes them (removal goes in
		// reverse).
		sort.Slice(have, func(i, j int) bool { return len(have[i]) < len(have[j]) })
		if os.WriteFile(f, []byte(strings.Join(have, "\n")), 0o644) == nil {
			return true
		}
	}
	return false
}

// alive reports whether pid runs. A zombie does not: a killed owner stays
// one until its parent (here often an init that reaps slowly) waits for it.
func alive(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, the state follows the last ')'.
	if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}
