package cluster

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The node LAN of a multi-node cluster (Options.Nodes > 1): one bridge in a
// namespace of its own, never in the root namespace.
//
//	lan netns "<p>-lan"     br0 198.19.0.254/24: the control plane's host
//	                        on the LAN (kube-apiserver's egress proxy dials
//	                        kubelets and pods from here), routes to every
//	                        node's pod range via that node
//	node k (1..N)           eth0 198.19.0.k/24 (InternalIP), bridged to br0
//	                        through "n<k>" in the lan netns; node0 (dummy)
//	                        keeps the route to the Service range; the other
//	                        nodes' pod ranges via their LAN address, as a
//	                        routed CNI setup (Calico without overlay,
//	                        kube-router) has them
//	outside client k        eth0 198.19.0.(100+k)/24 on br0 ("lanc<k>"),
//	                        no route beyond the LAN: it reaches NodePorts
//
// A dual-stack cluster adds the IPv6 addresses and routes of dualstack.go.
var (
	// NodeLAN is the node LAN's subnet.
	NodeLAN = netip.MustParsePrefix("198.19.0.0/24")
	// LANHostIP is the lan namespace's address on the bridge.
	LANHostIP = netip.MustParseAddr("198.19.0.254")
)

// NodeCIDRMaskSize is the size of each node's pod range cut from PodCIDR
// by node IPAM (--node-cidr-mask-size): 64 nodes of 254 pods.
const NodeCIDRMaskSize = 24

const (
	lanBridge = "br0"
	// maxNodes keeps node addresses below the outside clients'.
	maxNodes = 50
	// firstLANClient is the last octet before the first outside client's.
	firstLANClient = 100
)

// nodeLANIP is node k's (1-based) address on the node LAN.
func nodeLANIP(k int) netip.Addr { return netip.AddrFrom4([4]byte{198, 19, 0, byte(k)}) }

// zoneOf is node k's (1-based) zone: three zones, round robin.
func zoneOf(k int) string { return fmt.Sprintf("zone-%c", 'a'+(k-1)%3) }

// makeLAN creates the lan namespace with its bridge, the namespaces of
// nodes 2..N (node 1 is the sandbox's), and plugs every node into the
// bridge with its LAN address.
func (c *Cluster) makeLAN() error {
	lan, err := c.Sandbox.AddNamespace("lan")
	if err != nil {
		return err
	}
	c.LAN = lan
	if err := lan.IPBatch(
		"link add "+lanBridge+" type bridge",
		fmt.Sprintf("addr add %s/%d dev %s", LANHostIP, NodeLAN.Bits(), lanBridge),
		"link set "+lanBridge+" up",
	); err != nil {
		return err
	}
	for k, n := range c.Nodes {
		if k == 0 {
			// The sandbox put the one-node address on the dummy; here it
			// lives on the LAN like every node's. Deleting a device's last
			// address flushes its routes, the Service range's too: put it
			// back, or the first node has no route to a VIP that nothing
			// DNATs (a Service without endpoints: "network is unreachable"
			// instead of a refusal, and its own processes cannot even
			// connect a UDP socket to a VIP).
			if err := n.NS.IPBatch(
				fmt.Sprintf("addr del %s/32 dev %s", sandbox.NodeIP, sandbox.NodeDummy),
				"route replace "+sandbox.VIPRange.String()+" dev "+sandbox.NodeDummy,
			); err != nil {
				return err
			}
		} else {
			ns, err := c.Sandbox.AddNamespace(fmt.Sprintf("node%d", k+1))
			if err != nil {
				return err
			}
			n.NS = ns
			if err := ns.IPBatch(
				"link add "+sandbox.NodeDummy+" type "+c.Sandbox.NodeDeviceKind,
				"link set "+sandbox.NodeDummy+" up",
				"route add "+sandbox.VIPRange.String()+" dev "+sandbox.NodeDummy,
			); err != nil {
				return err
			}
		}
		port := fmt.Sprintf("n%d", k+1)
		if err := lan.IPBatch(
			"link add "+port+" type veth peer name eth0 netns "+n.NS.Name,
			"link set "+port+" master "+lanBridge,
			"link set "+port+" up",
		); err != nil {
			return err
		}
		if err := n.NS.IPBatch(
			fmt.Sprintf("addr add %s/%d dev eth0", n.IP, NodeLAN.Bits()),
			"link set eth0 up",
		); err != nil {
			return err
		}
		// Pods' traffic to other nodes is routed through the node.
		if err := n.NS.WriteSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
		if out, err := n.NS.Exec("ip", "-4", "route", "show", sandbox.VIPRange.String()); err != nil || !strings.Contains(out, "dev "+sandbox.NodeDummy) {
			return fmt.Errorf("node %s: no route to the Service range %s via %s (%q, %v)", n.Name, sandbox.VIPRange, sandbox.NodeDummy, out, err)
		}
	}
	c.logf("cluster: node LAN %s in %s: %d nodes", NodeLAN, lan.Name, len(c.Nodes))
	return nil
}

// routePodCIDRs adds, on every node and in the lan namespace, a route to
// each other node's IPv4 pod range via that node's LAN address.
func (c *Cluster) routePodCIDRs() error {
	return c.routePodRanges("", func(n *Node) (netip.Prefix, netip.Addr) { return n.PodCIDR, n.IP })
}

// routePodRanges adds the routes of one family: range gives a node's pod
// range and LAN address in it; family names it in errors ("" or "IPv6 ").
func (c *Cluster) routePodRanges(family string, ranges func(*Node) (netip.Prefix, netip.Addr)) error {
	for _, to := range c.Nodes {
		cidr, ip := ranges(to)
		if !cidr.IsValid() {
			return fmt.Errorf("node %s has no %spod range", to.Name, family)
		}
		via := fmt.Sprintf("route replace %s via %s dev ", cidr, ip)
		for _, from := range c.Nodes {
			if from == to {
				continue
			}
			if err := from.NS.IPBatch(via + "eth0"); err != nil {
				return err
			}
		}
		if err := c.LAN.IPBatch(via + lanBridge); err != nil {
			return err
		}
		c.logf("cluster: pod range %s of %s via %s", cidr, to.Name, ip)
	}
	return nil
}

// AddLANClient adds a namespace on the node LAN outside every node (the
// next free address from 198.19.0.101), for traffic from outside the
// cluster to NodePorts. Its ephemeral port range is widened to 1024-65535
// (inside it only). The sandbox deletes it with the cluster.
func (c *Cluster) AddLANClient() (*sandbox.NS, error) {
	if c.LAN == nil {
		return nil, errors.New("cluster: no node LAN on a one-node cluster (use Sandbox.AddClient)")
	}
	c.mu.Lock()
	c.lanClients++
	k := c.lanClients
	c.mu.Unlock()
	if firstLANClient+k >= int(LANHostIP.As4()[3]) {
		return nil, fmt.Errorf("cluster: too many LAN clients (%d)", k)
	}
	n, err := c.Sandbox.AddNamespace(fmt.Sprintf("lanc%d", k))
	if err != nil {
		return nil, err
	}
	n.Addr = netip.AddrFrom4([4]byte{198, 19, 0, byte(firstLANClient + k)})
	port := fmt.Sprintf("c%d", k)
	if err := c.LAN.IPBatch(
		"link add "+port+" type veth peer name eth0 netns "+n.Name,
		"link set "+port+" master "+lanBridge,
		"link set "+port+" up",
	); err != nil {
		return nil, err
	}
	if err := n.IPBatch(
		fmt.Sprintf("addr add %s/%d dev eth0", n.Addr, NodeLAN.Bits()),
		"link set eth0 up",
	); err != nil {
		return nil, err
	}
	if err := n.WriteSysctl("net/ipv4/ip_local_port_range", "1024 65535"); err != nil {
		return nil, err
	}
	if c.opts.DualStack {
		// The range is shared by both families.
		if _, err := addLANClient6(n, byte(firstLANClient+k)); err != nil {
			return nil, err
		}
	}
	c.logf("cluster: LAN client %s in %s", n.Addr, n.Name)
	return n, nil
}
