package cni

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// KernelHost is the real Host: netlink and /proc/sys in the namespace the
// plugin runs in (the node's).
type KernelHost struct{}

var _ Host = KernelHost{}

const ipForward = "/proc/sys/net/ipv4/ip_forward"

// BridgePort reports whether ifName is enslaved to a bridge.
func (KernelHost) BridgePort(ifName string) (bool, bool, error) {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, false, nil
		}
		return false, false, err
	}
	master := link.Attrs().MasterIndex
	if master == 0 {
		return false, true, nil
	}
	m, err := netlink.LinkByIndex(master)
	if err != nil {
		return false, true, fmt.Errorf("master of %s: %w", ifName, err)
	}
	_, isBridge := m.(*netlink.Bridge)
	return isBridge, true, nil
}

// Hairpin reads the port's hairpin flag.
func (KernelHost) Hairpin(ifName string) (bool, error) {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return false, err
	}
	pi, err := netlink.LinkGetProtinfo(link)
	if err != nil {
		return false, err
	}
	return pi.Hairpin, nil
}

// SetHairpin sets the port's hairpin flag.
func (KernelHost) SetHairpin(ifName string, on bool) error {
	link, err := netlink.LinkByName(ifName)
	if err != nil {
		return err
	}
	return netlink.LinkSetHairpin(link, on)
}

// Forwarding reads net.ipv4.ip_forward.
func (KernelHost) Forwarding() (bool, error) {
	b, err := os.ReadFile(ipForward)
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// EnableForwarding sets net.ipv4.ip_forward to 1 unless it already is.
func (h KernelHost) EnableForwarding() error {
	if on, err := h.Forwarding(); err == nil && on {
		return nil
	}
	return os.WriteFile(ipForward, []byte("1"), 0o644)
}

// PodAddrs reads the global unicast addresses of ifName in the namespace.
func (KernelHost) PodAddrs(netnsPath, ifName string) ([]netip.Addr, error) {
	var out []netip.Addr
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return err
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
				out = append(out, ip.Unmap())
			}
		}
		return nil
	})
	var gone ns.NSPathNotExistErr
	if errors.As(err, &gone) {
		return nil, nil
	}
	return out, err
}

// DeleteFlows deletes every conntrack entry pointing at one of addrs.
func (KernelHost) DeleteFlows(addrs []netip.Addr) (int, error) {
	ct, err := conntrack.New()
	if err != nil {
		return 0, err
	}
	defer ct.Close()
	filters := make([]conntrack.Filter, 0, len(addrs))
	for _, a := range addrs {
		filters = append(filters, conntrack.Filter{Addr: a})
	}
	return ct.Delete(filters...)
}
