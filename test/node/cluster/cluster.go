package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Options configure Start; the zero value is ready to use.
type Options struct {
	// NodeName is the Node kubelet registers (default "steelyard-node").
	NodeName string
	// Logf receives progress lines.
	Logf func(format string, args ...any)
	// ReadyTimeout bounds the wait for the Node to be Ready (default 3m).
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
}

// Cluster is a running one-node cluster. Stop tears it all down.
type Cluster struct {
	// CP is etcd and kube-apiserver; CP.Kubeconfig is the admin's
	// kubeconfig (usable from the root namespace).
	CP *controlplane.ControlPlane
	// Sandbox holds the node namespace (Sandbox.Node) and clients.
	Sandbox *sandbox.Sandbox
	// Dir holds everything else: containerd's root and state, kubelet's
	// root, configs, logs. Stop removes it.
	Dir string
	// NodeName is the Node's name; NodeIP its InternalIP (sandbox.NodeIP).
	NodeName string
	NodeIP   netip.Addr
	// APIPort is kube-apiserver's port, on 127.0.0.1 of the root namespace
	// and relayed on every address of the node namespace.
	APIPort int
	// CNIConfDir and CNIBinDir are the node's /etc/cni/net.d and
	// /opt/cni/bin as seen from the root mount namespace.
	CNIConfDir, CNIBinDir string
	// ContainerdSock is containerd's socket (for ctr).
	ContainerdSock string
	// Binaries in use.
	Binaries Binaries

	opts         Options
	cgroup       string
	mntns        string
	madeEtcCNI   []string
	tunablesHeld bool
	proxy        *connectProxy
	stopForward  func()

	mu         sync.Mutex
	components []*controlplane.Component // start order; Stop goes in reverse
	kubelet    *controlplane.Component
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

// Start brings the node up: control plane, controllers, containerd with
// the images imported, kubelet, and waits for the Node to be Ready. On
// error everything started is torn down.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
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
		NodeName: opts.NodeName,
		NodeIP:   sandbox.NodeIP,
		Binaries: bins,
		opts:     opts,
		cgroup:   fmt.Sprintf("%s%d-%s", ownerPrefix, os.Getpid(), strings.TrimPrefix(filepath.Base(dir), fmt.Sprintf("%s%d-", ownerPrefix, os.Getpid()))),
	}
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

func (c *Cluster) logf(format string, args ...any) { c.opts.Logf(format, args...) }

func (c *Cluster) start(ctx context.Context) error {
	t0 := time.Now()
	var err error
	c.Sandbox, err = sandbox.New(sandbox.Options{Prefix: "syn", Dir: filepath.Join(c.Dir, "sandbox"), Logf: c.opts.Logf})
	if err != nil {
		return err
	}
	sock := filepath.Join(c.Dir, "egress.sock")
	if c.proxy, err = startConnectProxy(c.Sandbox.Node, sock); err != nil {
		return err
	}
	egress := filepath.Join(c.Dir, "egress-selector.yaml")
	if err := os.WriteFile(egress, []byte(egressSelectorConfig(sock)), 0o644); err != nil {
		return err
	}
	c.CP, err = controlplane.StartProcess(ctx, controlplane.Options{
		Binaries: bins(c.Binaries),
		Logf:     c.opts.Logf,
		APIServerArgs: []string{
			// The node's address: the kubernetes Service's endpoint and a
			// name in the serving certificate (127.0.0.1, the bind
			// address, stays in it too).
			"--advertise-address=" + c.NodeIP.String(),
			"--endpoint-reconciler-type=lease",
			"--egress-selector-config-file=" + egress,
			"--allow-privileged=true",
			// kubelet is reached at its InternalIP (through the egress
			// proxy); the node name does not resolve.
			"--kubelet-preferred-address-types=InternalIP",
		},
	})
	if err != nil {
		return err
	}
	u, err := url.Parse(c.CP.URL)
	if err != nil {
		return err
	}
	if c.APIPort, err = strconv.Atoi(u.Port()); err != nil {
		return err
	}
	// kube-apiserver on every address of the node namespace, same port:
	// kubelet, the agent (hostNetwork) and pods reach it there.
	if c.stopForward, err = c.Sandbox.Node.Forward(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(c.APIPort)), "127.0.0.1:"+u.Port()); err != nil {
		return err
	}
	if err := c.startControllers(); err != nil {
		return err
	}
	if err := c.prepareNode(); err != nil {
		return err
	}
	if err := c.startContainerd(ctx); err != nil {
		return err
	}
	if err := c.importImages(ctx); err != nil {
		return err
	}
	if err := c.startKubelet(); err != nil {
		return err
	}
	if err := c.waitNodeReady(ctx); err != nil {
		return err
	}
	c.logf("cluster: node %s Ready in %v (dir %s, kubeconfig %s)", c.NodeName, time.Since(t0).Round(time.Millisecond), c.Dir, c.CP.Kubeconfig)
	return nil
}

func bins(b Binaries) controlplane.Binaries { return b.Binaries }

func (c *Cluster) add(p *controlplane.Component) {
	c.mu.Lock()
	c.components = append(c.components, p)
	c.mu.Unlock()
}

func freePort() (int, error) {
	l, err := netListenLoopback()
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startControllers starts kube-controller-manager and kube-scheduler in
// the root namespace, as the admin, serving only on 127.0.0.1.
func (c *Cluster) startControllers() error {
	kcmPort, err := freePort()
	if err != nil {
		return err
	}
	kcm, err := controlplane.StartComponent("kube-controller-manager", c.Binaries.KubeControllerManager, []string{
		"--kubeconfig=" + c.CP.Kubeconfig,
		"--leader-elect=false",
		controllersFlag(c.opts.ExtraControllers...),
		"--service-account-private-key-file=" + c.CP.ServiceAccountKeyFile(),
		"--root-ca-file=" + c.CP.CAFile,
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kcmPort),
		"--allocate-node-cidrs=false",
		// The EndpointSlice controller's batching: 0 (the default)
		// writes every change at once.
		"--v=1",
	}, filepath.Join(c.Dir, "kube-controller-manager.log"))
	if err != nil {
		return err
	}
	c.add(kcm)
	schedPort, err := freePort()
	if err != nil {
		return err
	}
	sched, err := controlplane.StartComponent("kube-scheduler", c.Binaries.KubeScheduler, []string{
		"--kubeconfig=" + c.CP.Kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(schedPort),
		"--v=1",
	}, filepath.Join(c.Dir, "kube-scheduler.log"))
	if err != nil {
		return err
	}
	c.add(sched)
	return nil
}

// prepareNode makes the node's cgroup, its mount namespace and its CNI
// directories, and records the host tunables.
func (c *Cluster) prepareNode() error {
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
	if err := makeCgroup(c.cgroup + "/runtime"); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	c.CNIConfDir = filepath.Join(c.Dir, "cni", "net.d")
	c.CNIBinDir = filepath.Join(c.Dir, "cni", "bin")
	for _, d := range []string{c.CNIConfDir, c.CNIBinDir, filepath.Join(c.Dir, "ns")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range []string{"bridge", "loopback", "host-local", "portmap"} {
		if err := copyFile(filepath.Join(c.Binaries.CNIPluginsDir, p), filepath.Join(c.CNIBinDir, p), 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(c.CNIConfDir, MainConflist), []byte(mainConflist(c.opts.BridgeHairpin)), 0o644); err != nil {
		return err
	}
	// The mount point of the node's /etc/cni/net.d.
	for _, d := range []string{"/etc/cni", "/etc/cni/net.d"} {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
			c.madeEtcCNI = append(c.madeEtcCNI, d)
		}
	}
	// So that the orphan clean-up of a killed owner knows them too.
	if err := os.WriteFile(filepath.Join(c.Dir, madeDirsFile), []byte(strings.Join(c.madeEtcCNI, "\n")), 0o644); err != nil {
		return err
	}
	// A persistent private mount namespace: bind-mount a directory onto
	// itself, make it private (a namespace file cannot sit on a shared
	// mount), and let unshare(1) pin the namespace to a file there.
	nsDir := filepath.Join(c.Dir, "ns")
	if err := run("mount", "--bind", nsDir, nsDir); err != nil {
		return err
	}
	if err := run("mount", "--make-private", nsDir); err != nil {
		return err
	}
	c.mntns = filepath.Join(nsDir, "mnt")
	if err := os.WriteFile(c.mntns, nil, 0o644); err != nil {
		return err
	}
	if err := run("unshare", "--mount="+c.mntns, "--propagation", "private", "true"); err != nil {
		return err
	}
	script := strings.Join([]string{
		"set -e",
		"for d in /run /var/lib /var/log /opt; do mount -t tmpfs -o mode=0755,size=512m steelyard-node $d; done",
		"mkdir -p /opt/cni/bin /var/lib/cni /run/netns",
		"mount --bind " + c.CNIBinDir + " /opt/cni/bin",
		"mount --bind " + c.CNIConfDir + " /etc/cni/net.d",
		"touch /run/xtables.lock",
	}, "\n")
	return run("nsenter", "--mount="+c.mntns, "--", "sh", "-c", script)
}

// inNode returns the argv that runs argv in the node's network and mount
// namespaces.
func (c *Cluster) inNode(argv ...string) []string {
	return append([]string{"--net=" + c.Sandbox.Node.Path(), "--mount=" + c.mntns, "--"}, argv...)
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	dir := filepath.Join(c.Dir, "containerd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte(containerdConfig(dir, c.Binaries.ContainerdShimDir, c.Binaries.Runc)), 0o644); err != nil {
		return err
	}
	c.ContainerdSock = filepath.Join(dir, "containerd.sock")
	t0 := time.Now()
	p, err := controlplane.StartComponent("containerd", "nsenter", c.inNode(
		"env", "PATH="+c.Binaries.ContainerdShimDir+":/usr/sbin:/usr/bin:/sbin:/bin",
		c.Binaries.Containerd, "--config", cfg, "--log-level", "info",
	), filepath.Join(c.Dir, "containerd.log"))
	if err != nil {
		return err
	}
	c.add(p)
	// Its shims and their containers inherit the cgroup.
	if err := joinCgroup(c.cgroup+"/runtime", p.Pid()); err != nil {
		return fmt.Errorf("containerd cgroup: %w", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := c.ctr(ctx, "version"); err == nil {
			break
		} else if time.Now().After(deadline) || !p.Running() {
			return fmt.Errorf("containerd not ready: %v; log:\n%s", err, p.Tail(30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.logf("cluster: containerd %s ready in %v", ContainerdVersion, time.Since(t0).Round(time.Millisecond))
	return nil
}

// ctr runs ctr against the node's containerd, in its k8s.io namespace.
func (c *Cluster) ctr(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, c.Binaries.Ctr, append([]string{"--address", c.ContainerdSock, "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// importImages imports every image tarball.
func (c *Cluster) importImages(ctx context.Context) error {
	t0 := time.Now()
	images := append(append([]string(nil), c.Binaries.Images...), c.opts.ExtraImages...)
	for _, img := range images {
		if err := c.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	c.logf("cluster: %d images imported in %v", len(images), time.Since(t0).Round(time.Millisecond))
	return nil
}

// ImportImage imports one docker-archive tarball into the node.
func (c *Cluster) ImportImage(ctx context.Context, tarball string) error {
	return c.ctr(ctx, "images", "import", "--local", tarball)
}

func (c *Cluster) startKubelet() error {
	dir := filepath.Join(c.Dir, "kubelet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	resolv := filepath.Join(c.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# no DNS in the box\n"), 0o644); err != nil {
		return err
	}
	cfg := filepath.Join(c.Dir, "kubelet.yaml")
	doc := kubeletConfig("/"+c.cgroup, c.ContainerdSock, resolv, "/var/log/pods", c.NodeIP)
	if c.opts.ClusterDNS.IsValid() {
		doc += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: cluster.local\n", c.opts.ClusterDNS)
	}
	if err := os.WriteFile(cfg, []byte(doc), 0o644); err != nil {
		return err
	}
	p, err := controlplane.StartComponent("kubelet", "nsenter", c.inNode(
		c.Binaries.Kubelet,
		"--config="+cfg,
		"--kubeconfig="+c.CP.Kubeconfig,
		"--root-dir="+dir,
		"--hostname-override="+c.NodeName,
		"--node-ip="+c.NodeIP.String(),
		"--v=1",
	), filepath.Join(c.Dir, "kubelet.log"))
	if err != nil {
		return err
	}
	c.add(p)
	c.mu.Lock()
	c.kubelet = p
	c.mu.Unlock()
	return joinCgroup(c.cgroup+"/runtime", p.Pid())
}

// waitNodeReady waits for the Node's Ready condition.
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	client := c.CP.Client()
	last := "not registered"
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					if cond.Status == corev1.ConditionTrue {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		}
		c.mu.Lock()
		k := c.kubelet
		c.mu.Unlock()
		if !k.Running() {
			return fmt.Errorf("kubelet exited: %v", k.ExitError())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready after %v: %s", c.NodeName, c.opts.ReadyTimeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
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
		fmt.Fprintf(&b, "--- %s, last lines:\n%s\n", filepath.Base(p.LogPath()), p.Tail(n))
	}
	if c.CP != nil {
		b.WriteString(c.CP.Logs(n))
	}
	return b.String()
}

// Stop tears everything down: kubelet, then every process in the node's
// cgroup (containerd, shims, containers), the mount namespace, the
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
	// kubelet and containerd first (the last two components), so nothing
	// restarts containers while they are killed.
	for i := len(comps) - 1; i >= 0; i-- {
		comps[i].Stop(10 * time.Second)
	}
	if err := removeCgroup(c.cgroup); err != nil {
		errs = append(errs, err)
	}
	if c.mntns != "" {
		if err := unmountUnder(filepath.Join(c.Dir, "ns")); err != nil {
			errs = append(errs, err)
		}
	}
	if c.stopForward != nil {
		c.stopForward()
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

// TaskPid returns the host PID of a running container's main process, by
// the containerID of a Pod's status ("containerd://<id>" or the bare id).
// Its /proc/<pid>/ns/net is the pod's network namespace.
func (c *Cluster) TaskPid(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := exec.CommandContext(ctx, c.Binaries.Ctr, "--address", c.ContainerdSock, "-n", "k8s.io", "tasks", "ls").Output()
	if err != nil {
		return 0, fmt.Errorf("ctr tasks ls: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s has no running task", id)
}
