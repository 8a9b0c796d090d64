package cluster

import (
	"fmt"
	"net/netip"
	"strconv"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Dual-stack (Options.DualStack, several nodes only): every range gets an
// IPv6 twin from 2001:2::/48, as a kubeadm or kind dual-stack cluster has
// them, IPv4 first (the primary family: Services without ipFamilyPolicy
// stay IPv4, status.podIP is the IPv4 address).
//
//	2001:2::/112            Services (--service-cluster-ip-range's second
//	                        range), inside the sandbox's VIPRange6; routed
//	                        to node0 in every node namespace like 198.18/16
//	2001:2:0:100::/56       pods (--cluster-cidr's second range): node IPAM
//	                        cuts a /64 per node (--node-cidr-mask-size-ipv6)
//	2001:2:0:fc::/64        the node LAN: node k at ::k (its second
//	                        InternalIP, kubelet --node-ip=v4,v6), the lan
//	                        namespace at ::fe, outside client k at
//	                        ::(100+k), the same last byte as in IPv4
//
// They stay clear of the sandbox's own IPv6 plan (test/sandbox/parity.go:
// 2001:2:0:1::/64, 2001:2:0:fd::/64, 2001:2:0:fe::/64). IPv6 forwarding is
// on in the node namespaces only (never in the root namespace); each
// node's pod /64 is routed via its LAN address on the other nodes and in
// the lan namespace, as the IPv4 /24s are.
var (
	// ServiceCIDR6 is the IPv6 Service range.
	ServiceCIDR6 = netip.MustParsePrefix("2001:2::/112")
	// PodCIDR6 is the IPv6 pod range node IPAM cuts each node's /64 from.
	PodCIDR6 = netip.MustParsePrefix("2001:2:0:100::/56")
	// NodeLAN6 is the node LAN's IPv6 subnet; LANHostIP6 the lan
	// namespace's address on it.
	NodeLAN6   = netip.MustParsePrefix("2001:2:0:fc::/64")
	LANHostIP6 = netip.MustParseAddr("2001:2:0:fc::fe")
)

// NodeCIDRMaskSize6 is the size of each node's IPv6 pod range
// (--node-cidr-mask-size-ipv6, kube-controller-manager's default).
const NodeCIDRMaskSize6 = 64

// nodeLANIP6 is node k's (1-based) IPv6 address on the node LAN.
func nodeLANIP6(k int) netip.Addr { return lanAddr6(byte(k)) }

// lanAddr6 is the node LAN's IPv6 address ending in last.
func lanAddr6(last byte) netip.Addr {
	a := NodeLAN6.Addr().As16()
	a[15] = last
	return netip.AddrFrom16(a)
}

// DualStack reports whether the cluster runs both IP families.
func (c *Cluster) DualStack() bool { return c.opts.DualStack }

// serviceCIDRsFlag is kube-apiserver's --service-cluster-ip-range: the
// controlplane package's IPv4 range, and ServiceCIDR6 when dual.
func serviceCIDRsFlag(v4 string, dual bool) string {
	if !dual {
		return "--service-cluster-ip-range=" + v4
	}
	return "--service-cluster-ip-range=" + v4 + "," + ServiceCIDR6.String()
}

// nodeIPAMArgs are kube-controller-manager's node IPAM flags: on one node
// all of PodCIDR for it; on several a /24 each; dual-stack adds PodCIDR6
// with a /64 each (kube-controller-manager refuses --node-cidr-mask-size
// with two cluster CIDRs: the per-family flags then).
func nodeIPAMArgs(nodes int, dual bool) []string {
	mask := PodCIDR.Bits()
	if nodes > 1 {
		mask = NodeCIDRMaskSize
	}
	if !dual {
		return []string{
			"--allocate-node-cidrs=true",
			"--cluster-cidr=" + PodCIDR.String(),
			"--node-cidr-mask-size=" + strconv.Itoa(mask),
		}
	}
	return []string{
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + PodCIDR.String() + "," + PodCIDR6.String(),
		"--node-cidr-mask-size-ipv4=" + strconv.Itoa(mask),
		"--node-cidr-mask-size-ipv6=" + strconv.Itoa(NodeCIDRMaskSize6),
	}
}

// enableIPv6 turns IPv6 on in ns (a new namespace may start with it off)
// and, when forward, IPv6 forwarding: written inside ns, so only there.
func enableIPv6(ns *sandbox.NS, forward bool) error {
	if err := ns.WriteSysctl("net/ipv6/conf/all/disable_ipv6", "0"); err != nil {
		return err
	}
	if err := ns.WriteSysctl("net/ipv6/conf/default/disable_ipv6", "0"); err != nil {
		return err
	}
	if !forward {
		return nil
	}
	return ns.WriteSysctl("net/ipv6/conf/all/forwarding", "1")
}

// makeLAN6 gives the lan namespace's bridge and every node's eth0 their
// IPv6 addresses (nodad: usable at once), turns on IPv6 forwarding in the
// node namespaces and routes ServiceCIDR6 to node0 there.
func (c *Cluster) makeLAN6() error {
	if err := enableIPv6(c.LAN, false); err != nil {
		return err
	}
	if err := c.LAN.IPBatch(fmt.Sprintf("addr add %s/%d dev %s nodad", LANHostIP6, NodeLAN6.Bits(), lanBridge)); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := enableIPv6(n.NS, true); err != nil {
			return err
		}
		if err := n.NS.IPBatch(
			fmt.Sprintf("addr add %s/%d dev eth0 nodad", n.IP6, NodeLAN6.Bits()),
			"route add "+ServiceCIDR6.String()+" dev "+sandbox.NodeDummy,
		); err != nil {
			return err
		}
	}
	c.logf("cluster: node LAN %s, Services %s, pods %s (dual-stack)", NodeLAN6, ServiceCIDR6, PodCIDR6)
	return nil
}

// routePodCIDRs6 is routePodCIDRs for the IPv6 ranges.
func (c *Cluster) routePodCIDRs6() error {
	return c.routePodRanges("IPv6 ", func(n *Node) (netip.Prefix, netip.Addr) { return n.PodCIDR6, n.IP6 })
}

// addLANClient6 gives LAN client n (eth0 on the bridge, IPv4 address
// ending in last) the IPv6 address with the same last byte.
func addLANClient6(n *sandbox.NS, last byte) (netip.Addr, error) {
	if err := enableIPv6(n, false); err != nil {
		return netip.Addr{}, err
	}
	a := lanAddr6(last)
	return a, n.IPBatch(fmt.Sprintf("addr add %s/%d dev eth0 nodad", a, NodeLAN6.Bits()))
}

// LANClientIP6 is the IPv6 address AddLANClient gave client n on a
// dual-stack cluster (invalid otherwise).
func (c *Cluster) LANClientIP6(n *sandbox.NS) netip.Addr {
	if !c.opts.DualStack || !n.Addr.Is4() {
		return netip.Addr{}
	}
	return lanAddr6(n.Addr.As4()[3])
}

// ClusterCIDRs is the pod ranges as a cluster CIDR value (kube-proxy's
// clusterCIDR, steelyard's --cluster-cidr): PodCIDR, and PodCIDR6 after a
// comma when dual-stack.
func (c *Cluster) ClusterCIDRs() string {
	if c.opts.DualStack {
		return PodCIDR.String() + "," + PodCIDR6.String()
	}
	return PodCIDR.String()
}
