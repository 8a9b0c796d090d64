package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Netlink is the real Interface: netlink's conntrack API in the network
// namespace where New was called (no shell-out to the conntrack tool).
type Netlink struct {
	h *netlink.Handle
}

var _ Interface = (*Netlink)(nil)

// New opens a netfilter netlink socket in the calling thread's network
// namespace; the Netlink value keeps using that namespace.
func New() (*Netlink, error) {
	// Only NETLINK_NETFILTER (conntrack) and NETLINK_ROUTE (the node's
	// addresses, for OrigDstLocal): the default set also opens XFRM
	// sockets, which fail where that module is missing.
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("conntrack: netlink socket: %w", err)
	}
	return &Netlink{h: h}, nil
}

// Close releases the netlink socket.
func (n *Netlink) Close() { n.h.Close() }

var families = []netlink.InetFamily{unix.AF_INET, unix.AF_INET6}

// List returns the flows of both address families.
func (n *Netlink) List() ([]Flow, error) {
	var out []Flow
	for _, fam := range families {
		flows, err := n.h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			if noConntrack(err) {
				continue
			}
			return nil, fmt.Errorf("conntrack: list: %w", err)
		}
		for _, f := range flows {
			out = append(out, fromNetlink(f))
		}
	}
	return out, nil
}

// Delete deletes the flows matching any filter, in the families the filters
// name.
func (n *Netlink) Delete(filters ...Filter) (int, error) {
	if err := validate(filters); err != nil {
		return 0, err
	}
	var local Local
	if needsLocal(filters) {
		var err error
		if local, err = n.localAddrs(); err != nil {
			return 0, err
		}
	}
	byFamily := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, f := range filters {
		nf := netlinkFilter{f, local}
		switch f.family() {
		case 4:
			byFamily[unix.AF_INET] = append(byFamily[unix.AF_INET], nf)
		case 6:
			byFamily[unix.AF_INET6] = append(byFamily[unix.AF_INET6], nf)
		default:
			byFamily[unix.AF_INET] = append(byFamily[unix.AF_INET], nf)
			byFamily[unix.AF_INET6] = append(byFamily[unix.AF_INET6], nf)
		}
	}
	total := 0
	var errs []error
	for _, fam := range families {
		fs := byFamily[fam]
		if len(fs) == 0 {
			continue
		}
		k, err := n.h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, fs...)
		total += int(k)
		if err != nil && !noConntrack(err) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return total, fmt.Errorf("conntrack: delete: %w", err)
	}
	return total, nil
}

// noConntrack tells the errors of a kernel without conntrack (module not
// loaded, or no such family): there is nothing to list or delete.
func noConntrack(err error) bool {
	return errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EAFNOSUPPORT)
}

// localAddrs returns the addresses of every interface of the namespace.
func (n *Netlink) localAddrs() (Local, error) {
	var addrs []netlink.Addr
	var err error
	// A dump interrupted by an address change is incomplete: read again.
	for try := 0; try < 3; try++ {
		if addrs, err = n.h.AddrList(nil, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("conntrack: listing the node's addresses: %w", err)
	}
	local := Local{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			local[ip.Unmap()] = true
		}
	}
	return local, nil
}

// netlinkFilter applies a Filter to netlink's flows.
type netlinkFilter struct {
	f     Filter
	local Local
}

func (nf netlinkFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	return nf.f.Match(fromNetlink(fl), nf.local)
}

func fromNetlink(f *netlink.ConntrackFlow) Flow {
	return Flow{
		Protocol: protocol(f.Forward.Protocol),
		OrigSrc:  addrPortOf(f.Forward.SrcIP, f.Forward.SrcPort),
		OrigDst:  addrPortOf(f.Forward.DstIP, f.Forward.DstPort),
		ReplySrc: addrPortOf(f.Reverse.SrcIP, f.Reverse.SrcPort),
		ReplyDst: addrPortOf(f.Reverse.DstIP, f.Reverse.DstPort),
	}
}

func protocol(p uint8) dataplane.Protocol {
	switch p {
	case unix.IPPROTO_TCP:
		return dataplane.TCP
	case unix.IPPROTO_UDP:
		return dataplane.UDP
	case unix.IPPROTO_SCTP:
		return dataplane.SCTP
	}
	return dataplane.Protocol(fmt.Sprintf("proto-%d", p))
}

func addrPortOf(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}
