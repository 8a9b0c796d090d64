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
)

// nodeFlags tell the agent and verify about this node: its zone (topology)
// and the addresses node ports are open on.
type nodeFlags struct {
	zone              string
	nodePortAddresses []string
	// sysctlDir is run's --sysctl-dir.
	sysctlDir string
	// onPodCIDRs, when set, sees this Node's spec.podCIDRs at each change
	// of the Node (run's --detect-local-mode=NodeCIDR).
	onPodCIDRs func([]netip.Prefix)
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
func (f *nodeFlags) builder(ctx context.Context, d *dataplane.DualStack, kubeconfig, manifests, nodeName string) (*controller.Builder, []netip.Addr) {
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
	if d.IPv6() {
		b.EnableIPv6()
	}
	return b, primary
}

// setupParity wires the kube-proxy parity features into the agent: the
// Builder's node facts and IP families, the node port addresses (into
// addrs, which d reads at each Sync), IPv6 forwarding, and the
// healthCheckNodePort servers, whose wrapper becomes agent.Dataplane.
//
// In cluster mode it then follows the Node (controller.WatchNode): a new
// zone or primary address reaches the next sync, which trigger requests.
func (f *nodeFlags) setupParity(ctx context.Context, agent *controller.Agent, d *dataplane.DualStack, addrs *nodeAddressSource, kubeconfig, manifests, nodeName string, trigger func()) error {
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
	b, primary := f.builder(ctx, d, kubeconfig, manifests, nodeName)
	agent.Builder.NodeName, agent.Builder.Zone = b.NodeName, b.Zone
	var nodeWatch *controller.NodeWatcher
	if manifests == "" {
		if client, err := newClient(kubeconfig); err == nil {
			nodeWatch = controller.WatchNode(ctx, client, nodeName, func(nf controller.NodeFacts) {
				if f.onPodCIDRs != nil {
					f.onPodCIDRs(nf.PodCIDRs)
				}
				agent.NodeChanged()
				trigger()
			})
			if f.zone == "" { // the flag, when given, wins over the label
				agent.Zone = func() string {
					if nf, ok := nodeWatch.Facts(); ok {
						return nf.Zone
					}
					return b.Zone
				}
			}
		}
	}
	addrs.set(func() []netip.Addr {
		if nodeWatch != nil {
			if nf, ok := nodeWatch.Facts(); ok {
				return nodePortAddresses(cidrs, nf.Addrs)
			}
		}
		return nodePortAddresses(cidrs, primary)
	})
	if d.IPv6() {
		agent.Builder.EnableIPv6()
		if err := setIPv6Forwarding(f.sysctlDir); err != nil {
			log.WithError(err).Warn("cannot turn on IPv6 forwarding")
		}
	}
	log.WithField("addresses", addrs.get()).WithField("zone", b.Zone).Info("node ports and topology")
	hc := controller.NewHealthChecks(d, netip.Addr{})
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

// setIPv6Forwarding turns on IPv6 forwarding, which every mode needs for
// IPv6 Service ports to pods; tests replace it (they run in no namespace).
var setIPv6Forwarding = func(dir string) error {
	if dir == "" {
		dir = dataplane.ProcSys
	}
	return dataplane.SetSysctlAt(dir, "net.ipv6.conf.all.forwarding", "1")
}
