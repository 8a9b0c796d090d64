package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// openIPTables returns the iptables dataplane for both IP families: the
// IPv4 tables always, the IPv6 ones when ip6tables works on this node
// (a kernel without IPv6 leaves steelyard IPv4-only, with a log line).
func openIPTables(ipt iptables.Interface, mode iptables.Mode, cfg iptables.Config) dataplane.Dataplane {
	ipt6, err := iptables.New6(mode)
	if err == nil {
		_, err = ipt6.SaveAll()
	}
	if err != nil {
		log.WithError(err).Info("ip6tables unusable: IPv4 only")
		ipt6 = nil
	}
	return iptables.NewDualStack(ipt, ipt6, cfg)
}

// cleanupIPv6 removes steelyard's ip6tables chains in mode, if that
// flavour of ip6tables works here.
func cleanupIPv6(mode iptables.Mode) error {
	ipt6, err := iptables.New6(mode)
	if err == nil {
		_, err = ipt6.SaveAll()
	}
	if err != nil {
		return nil // no IPv6 tables: nothing of ours there
	}
	return iptables.NewProxier(ipt6, iptables.Config{Family: 6}).Cleanup()
}

// nodeFlags tell the agent and verify about this node: its zone (topology)
// and the addresses node ports are open on.
type nodeFlags struct {
	zone              string
	nodePortAddresses []string
}

func (f *nodeFlags) register(cmd *cobra.Command, withAddresses bool) {
	cmd.Flags().StringVar(&f.zone, "node-zone", os.Getenv("NODE_ZONE"), "this node's topology zone for EndpointSlice hints and trafficDistribution (default: $NODE_ZONE, else the Node's topology.kubernetes.io/zone label; none with --manifests)")
	if withAddresses {
		cmd.Flags().StringSliceVar(&f.nodePortAddresses, "nodeport-addresses", nil,
			"CIDRs: node ports are open on the node's addresses within them (default: the node's primary addresses, the Node's InternalIPs; with --manifests, every non-loopback address)")
	}
}

// builder returns the Builder for this node: local endpoints by nodeName,
// the zone from the flag (or the Node, in cluster mode), and IPv6 when the
// dataplane programs it.
func (f *nodeFlags) builder(ctx context.Context, d dataplane.Dataplane, kubeconfig, manifests, nodeName string) (*controller.Builder, []netip.Addr) {
	b := controller.NewBuilder()
	b.NodeName, b.Zone = nodeName, f.zone
	var primary []netip.Addr
	if manifests == "" {
		if client, err := newClient(kubeconfig); err == nil {
			zone, addrs, err := controller.NodeInfo(ctx, client, nodeName)
			if err != nil {
				log.WithError(err).Warn("cannot read this node's Node object: no topology zone, node ports on local addresses")
			}
			if b.Zone == "" {
				b.Zone = zone
			}
			primary = addrs
		}
	}
	if ds, ok := unwrap(d).(*iptables.DualStack); ok && ds.V6 != nil || ipvsIPv6(unwrap(d)) {
		b.EnableIPv6()
	}
	return b, primary
}

// unwrap returns the dataplane under the health-check wrapper.
func unwrap(d dataplane.Dataplane) dataplane.Dataplane {
	if h, ok := d.(*controller.HealthChecks); ok {
		return h.Dataplane
	}
	return d
}

// setupParity wires the kube-proxy parity features into the agent: the
// Builder's node facts, the node port addresses, IPv6 forwarding, and the
// healthCheckNodePort servers.
func (f *nodeFlags) setupParity(ctx context.Context, agent *controller.Agent, kubeconfig, manifests, nodeName string) error {
	var cidrs []netip.Prefix
	for _, c := range f.nodePortAddresses {
		if c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("--nodeport-addresses %q: %w", c, err)
		}
		cidrs = append(cidrs, p.Masked())
	}
	b, primary := f.builder(ctx, agent.Dataplane, kubeconfig, manifests, nodeName)
	agent.Builder.NodeName, agent.Builder.Zone = b.NodeName, b.Zone
	addrs := func() []netip.Addr { return nodePortAddresses(cidrs, primary) }
	if ds, ok := agent.Dataplane.(*iptables.DualStack); ok {
		ds.V4.NodeAddresses = addrs
		if ds.V6 != nil {
			agent.Builder.EnableIPv6()
			ds.V6.NodeAddresses = addrs
			if err := dataplane.SetSysctl("net.ipv6.conf.all.forwarding", "1"); err != nil {
				log.WithError(err).Warn("cannot turn on IPv6 forwarding")
			}
		}
	}
	if p, ok := agent.Dataplane.(*ipvs.DualStack); ok {
		p.SetNodeAddresses(addrs) // one virtual service per address and node port
		if p.V6 != nil {
			agent.Builder.EnableIPv6()
		}
	}
	if d, ok := agent.Dataplane.(*nftables.DualStack); ok {
		d.V4.NodeAddresses, d.V6.NodeAddresses = addrs, addrs // the nodeport-ips set
	}
	log.WithField("addresses", addrs()).WithField("zone", b.Zone).Info("node ports and topology")
	hc := controller.NewHealthChecks(agent.Dataplane, netip.Addr{})
	hc.CloseOnDone(ctx)
	agent.Dataplane = hc
	return nil
}

// nodePortAddresses returns the addresses node ports are open on: the
// node's interface addresses within cidrs; without cidrs, the primary
// addresses when known, else every address that is not loopback or
// link-local.
func nodePortAddresses(cidrs []netip.Prefix, primary []netip.Addr) []netip.Addr {
	if len(cidrs) == 0 && len(primary) > 0 {
		return primary
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		log.WithError(err).Warn("cannot list the node's addresses")
		return primary
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		pfx, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := pfx.Addr().Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		if len(cidrs) > 0 && !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(ip) }) {
			continue
		}
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}
