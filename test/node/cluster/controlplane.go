package cluster

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"github.com/steelyard-net/steelyard/test/controlplane"
)

// startControlPlane starts kube-apiserver's egress proxy (dialling from
// the one node's namespace, or from the lan namespace that reaches every
// node), etcd and kube-apiserver, and relays kube-apiserver's port into
// every node namespace.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	dialNS := c.Sandbox.Node
	if c.LAN != nil {
		dialNS = c.LAN
	}
	sock := filepath.Join(c.Dir, "egress.sock")
	var err error
	if c.proxy, err = startConnectProxy(dialNS, sock); err != nil {
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
			// Node 1's address: the kubernetes Service's endpoint and a
			// name in the serving certificate (127.0.0.1, the bind
			// address, stays in it too).
			"--advertise-address=" + c.NodeIP.String(),
			"--endpoint-reconciler-type=lease",
			"--egress-selector-config-file=" + egress,
			"--allow-privileged=true",
			// kubelet is reached at its InternalIP (through the egress
			// proxy); the node name does not resolve.
			"--kubelet-preferred-address-types=InternalIP",
			// A later flag wins: the controlplane package's IPv4 range,
			// and the IPv6 one when dual-stack.
			serviceCIDRsFlag(controlplane.ServiceClusterIPRange, c.opts.DualStack),
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
	// kube-apiserver on every address of each node namespace, same port:
	// kubelet (its kubeconfig says 127.0.0.1), the agent (hostNetwork) and
	// pods reach it there; other nodes' pods reach node 1's through the
	// kubernetes Service.
	for _, n := range c.Nodes {
		if n.stopForward, err = n.NS.Forward(netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(c.APIPort)), "127.0.0.1:"+u.Port()); err != nil {
			return err
		}
	}
	return nil
}

func bins(b Binaries) controlplane.Binaries { return b.Binaries }

func freePort() (int, error) {
	l, err := netListenLoopback()
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startControllers starts kube-controller-manager and kube-scheduler in
// the root namespace, as the admin, serving only on 127.0.0.1. It runs
// node IPAM, as clusters do: each Node gets its pod range in
// spec.podCIDRs (a /24 of PodCIDR with several nodes, which their CNI
// configuration then uses; the one node all of PodCIDR), which steelyard's
// --detect-local-mode=NodeCIDR reads.
func (c *Cluster) startControllers() error {
	kcmPort, err := freePort()
	if err != nil {
		return err
	}
	extra := append(append([]string(nil), c.opts.ExtraControllers...), NodeIPAMController)
	ipam := nodeIPAMArgs(len(c.Nodes), c.opts.DualStack)
	kcm, err := controlplane.StartComponent("kube-controller-manager", c.Binaries.KubeControllerManager, append([]string{
		"--kubeconfig=" + c.CP.Kubeconfig,
		"--leader-elect=false",
		controllersFlag(extra...),
		"--service-account-private-key-file=" + c.CP.ServiceAccountKeyFile(),
		"--root-ca-file=" + c.CP.CAFile,
		"--use-service-account-credentials=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(kcmPort),
		// The EndpointSlice controller's batching: 0 (the default)
		// writes every change at once.
		"--v=1",
	}, ipam...), filepath.Join(c.Dir, "kube-controller-manager.log"))
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
