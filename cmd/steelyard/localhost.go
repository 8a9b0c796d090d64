package main

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
)

// routeLocalnet lets the kernel route 127.0.0.0/8 off the loopback
// interface: localhost node ports need it (DNAT from 127.0.0.1 to a pod).
const routeLocalnet = "net.ipv4.conf.all.route_localnet"

// localhostModes are the modes that serve localhost node ports (kube-proxy:
// iptables only; IPVS, as kube-proxy's, does not).
var localhostModes = map[string]bool{"iptables": true, "nftables": true, "ebpf": true}

// localhostNodePorts decides --localhost-nodeports for run: on only in a
// mode that serves it and, as in kube-proxy, when --nodeport-addresses
// (if given) covers 127.0.0.1.
func localhostNodePorts(dp *dataplaneFlags, node *nodeFlags) bool {
	if !dp.localhostNodePorts {
		return false
	}
	if !localhostModes[dp.mode] {
		log.WithField("mode", dp.mode).Info("--localhost-nodeports: this mode has no localhost node ports")
		return false
	}
	given := false
	for _, c := range node.nodePortAddresses {
		if c == "" {
			continue
		}
		given = true
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(netip.MustParseAddr("127.0.0.1")) {
			return true
		}
	}
	if given {
		log.Info("--localhost-nodeports: --nodeport-addresses leaves out 127.0.0.1, so node ports stay off loopback")
		return false
	}
	return true
}

// routeLocalnetWritable checks, without writing, that setRouteLocalnet can
// succeed: the sysctl is 1 already or its file opens for writing (a
// container's read-only /proc/sys fails here, with EROFS).
func routeLocalnetWritable(dir string) error {
	if v, err := dataplane.ReadSysctlAt(dir, routeLocalnet); err != nil {
		return err
	} else if v == "1" {
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, "net/ipv4/conf/all/route_localnet"), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// checkLocalhostNodePorts turns localhost node ports off, with a warning,
// when route_localnet cannot be written (a read-only /proc/sys without
// --sysctl-dir): they are on by default, and the rest of the agent works
// without them. Asked for explicitly, that is an error.
func checkLocalhostNodePorts(dp *dataplaneFlags, explicit bool) error {
	if !dp.localhostNodePorts {
		return nil
	}
	err := routeLocalnetWritable(dp.sysctlDir)
	if err == nil {
		return nil
	}
	if explicit {
		return errors.Join(errors.New("--localhost-nodeports needs "+routeLocalnet+"=1 (mount the host's /proc/sys/net and pass --sysctl-dir, see docs/least-privilege.md)"), err)
	}
	log.WithError(err).Warn("node ports stay off 127.0.0.0/8: cannot set " + routeLocalnet + " (pass --sysctl-dir, or --localhost-nodeports=false to silence this)")
	dp.localhostNodePorts = false
	return nil
}

// setRouteLocalnet writes route_localnet=1 in the agent's network namespace
// (the node's), before the first sync.
func setRouteLocalnet(dir string) error {
	if err := dataplane.SetSysctlAt(dir, routeLocalnet, "1"); err != nil {
		return errors.Join(errors.New("--localhost-nodeports needs "+routeLocalnet+"=1 (turn it off with --localhost-nodeports=false)"), err)
	}
	return nil
}

// localhostCounter reads the iptables mode's nfacct counter of accepted
// localhost node port packets; other modes keep none.
func localhostCounter(mode string, on bool) controller.LocalhostAccepted {
	return func() (uint64, bool) {
		if !on || mode != "iptables" {
			return 0, false
		}
		c, err := nfacct.Kernel{}.Get(iptables.LocalhostCounter)
		if err != nil {
			return 0, false
		}
		return c.Packets, true
	}
}

// serveKubeProxyCompat starts the kube-proxy compatible endpoint on addr
// (empty: off).
func serveKubeProxyCompat(ctx context.Context, addr, mode string, read controller.LocalhostAccepted) error {
	return serve(ctx, "kube-proxy-metrics", addr, "/", controller.KubeProxyCompatHandler(mode, read))
}
