package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// VirtualServer is one IPVS virtual service: a VIP, port and protocol with a
// scheduler. It is our own type so that the proxier and its tests never
// depend on moby/ipvs.
type VirtualServer struct {
	Address   netip.Addr
	Port      uint16
	Protocol  dataplane.Protocol
	Scheduler string
	// Persistence is the session affinity timeout in seconds (IPVS
	// persistent service); 0 for none.
	Persistence uint32
}

// ipvsPersistent is IP_VS_SVC_F_PERSISTENT.
const ipvsPersistent = 0x1

// Key identifies the virtual server in the kernel (the scheduler is a
// setting, not part of the identity).
func (v VirtualServer) Key() dataplane.VIP {
	return dataplane.VIP{IP: v.Address, Port: v.Port, Protocol: v.Protocol}
}

// RealServer is one IPVS destination of a virtual server, in Masq mode.
type RealServer struct {
	Address netip.Addr
	Port    uint16
	Weight  int
	// ActiveConn and InactiveConn are the kernel's live counters; they are
	// read, never written.
	ActiveConn   int
	InactiveConn int
	// InConns is the kernel's count of connections scheduled to this
	// destination since it was added (ipvsadm's InConns, the "conns"
	// statistic): a weight change keeps it, a delete and add resets it.
	// IPVS copies its statistics every 2 s, so it lags that much.
	InConns uint64
}

// Addr returns the destination's IP:port.
func (r RealServer) Addr() netip.AddrPort { return netip.AddrPortFrom(r.Address, r.Port) }

// Interface is the narrow view of the IPVS table the proxier needs. The real
// one talks generic netlink through moby/ipvs; Fake keeps a map and enforces
// the kernel's rules (no duplicates, no destination without its service).
type Interface interface {
	VirtualServers() ([]VirtualServer, error)
	AddVirtualServer(VirtualServer) error
	UpdateVirtualServer(VirtualServer) error
	DeleteVirtualServer(VirtualServer) error
	RealServers(VirtualServer) ([]RealServer, error)
	AddRealServer(VirtualServer, RealServer) error
	UpdateRealServer(VirtualServer, RealServer) error
	DeleteRealServer(VirtualServer, RealServer) error
}

// Links is the narrow view of the dummy interface that holds the VIPs.
type Links interface {
	// EnsureDummy creates the dummy interface name (up) if it is missing.
	EnsureDummy(name string) error
	// Addresses returns the addresses of name, both families, without the
	// IPv6 link-local one the kernel adds itself; none if it is missing.
	Addresses(name string) ([]netip.Addr, error)
	AddAddress(name string, a netip.Addr) error
	DelAddress(name string, a netip.Addr) error
	// DeleteDummy removes name if it exists.
	DeleteDummy(name string) error
}

// kernelIPVS is the real Interface over moby/ipvs.
type kernelIPVS struct{ h *mobyipvs.Handle }

// NewKernel opens the IPVS table of the network namespace the process runs
// in. moby/ipvs runs "modprobe ip_vs" first, so modprobe must be on PATH
// where the module is not built in.
func NewKernel() (Interface, error) {
	h, err := mobyipvs.New("")
	if err != nil {
		return nil, fmt.Errorf("open IPVS (is the ip_vs module available?): %w", err)
	}
	return &kernelIPVS{h: h}, nil
}

func protoNum(p dataplane.Protocol) uint16 {
	switch p {
	case dataplane.UDP:
		return syscall.IPPROTO_UDP
	case dataplane.SCTP:
		return syscall.IPPROTO_SCTP // 132; needs the kernel's ip_vs built with SCTP
	}
	return syscall.IPPROTO_TCP
}

func toMobyService(v VirtualServer) *mobyipvs.Service {
	s := &mobyipvs.Service{
		Address:   net.IP(v.Address.AsSlice()),
		Port:      v.Port,
		Protocol:  protoNum(v.Protocol),
		SchedName: v.Scheduler,
	}
	if v.Persistence > 0 {
		s.Flags, s.Timeout = ipvsPersistent, v.Persistence
	}
	if v.Address.Is4() {
		s.AddressFamily, s.Netmask = syscall.AF_INET, 0xffffffff
	} else {
		s.AddressFamily, s.Netmask = syscall.AF_INET6, 128
	}
	return s
}

func toMobyDest(r RealServer) *mobyipvs.Destination {
	d := &mobyipvs.Destination{
		Address:         net.IP(r.Address.AsSlice()),
		Port:            r.Port,
		Weight:          r.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   syscall.AF_INET,
	}
	if r.Address.Is6() {
		d.AddressFamily = syscall.AF_INET6
	}
	return d
}

func fromIP(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func (k *kernelIPVS) VirtualServers() ([]VirtualServer, error) {
	svcs, err := k.h.GetServices()
	if err != nil {
		return nil, fmt.Errorf("list IPVS services: %w", err)
	}
	out := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if s.FWMark != 0 {
			continue // not ours: steelyard never uses firewall-mark services
		}
		var p dataplane.Protocol
		switch s.Protocol {
		case syscall.IPPROTO_TCP:
			p = dataplane.TCP
		case syscall.IPPROTO_UDP:
			p = dataplane.UDP
		case syscall.IPPROTO_SCTP:
			p = dataplane.SCTP
		default:
			continue
		}
		vs := VirtualServer{Address: fromIP(s.Address), Port: s.Port, Protocol: p, Scheduler: s.SchedName}
		if s.Flags&ipvsPersistent != 0 {
			vs.Persistence = s.Timeout
		}
		out = append(out, vs)
	}
	return out, nil
}

func (k *kernelIPVS) AddVirtualServer(v VirtualServer) error {
	if err := k.h.NewService(toMobyService(v)); err != nil {
		return fmt.Errorf("add IPVS service %s (%s): %w", v.Key(), v.Scheduler, err)
	}
	return nil
}

func (k *kernelIPVS) UpdateVirtualServer(v VirtualServer) error {
	if err := k.h.UpdateService(toMobyService(v)); err != nil {
		return fmt.Errorf("update IPVS service %s (%s): %w", v.Key(), v.Scheduler, err)
	}
	return nil
}

func (k *kernelIPVS) DeleteVirtualServer(v VirtualServer) error {
	if err := k.h.DelService(toMobyService(v)); err != nil {
		return fmt.Errorf("delete IPVS service %s: %w", v.Key(), err)
	}
	return nil
}

func (k *kernelIPVS) RealServers(v VirtualServer) ([]RealServer, error) {
	ds, err := k.h.GetDestinations(toMobyService(v))
	if err != nil {
		return nil, fmt.Errorf("list destinations of %s: %w", v.Key(), err)
	}
	out := make([]RealServer, 0, len(ds))
	for _, d := range ds {
		out = append(out, RealServer{Address: fromIP(d.Address), Port: d.Port, Weight: d.Weight,
			ActiveConn: d.ActiveConnections, InactiveConn: d.InactiveConnections, InConns: inConns(d.Stats)})
	}
	return out, nil
}

func (k *kernelIPVS) AddRealServer(v VirtualServer, r RealServer) error {
	if err := k.h.NewDestination(toMobyService(v), toMobyDest(r)); err != nil {
		return fmt.Errorf("add destination %s to %s: %w", r.Addr(), v.Key(), err)
	}
	return nil
}

func (k *kernelIPVS) UpdateRealServer(v VirtualServer, r RealServer) error {
	if err := k.h.UpdateDestination(toMobyService(v), toMobyDest(r)); err != nil {
		return fmt.Errorf("set weight of %s in %s to %d: %w", r.Addr(), v.Key(), r.Weight, err)
	}
	return nil
}

func (k *kernelIPVS) DeleteRealServer(v VirtualServer, r RealServer) error {
	if err := k.h.DelDestination(toMobyService(v), toMobyDest(r)); err != nil {
		return fmt.Errorf("delete destination %s from %s: %w", r.Addr(), v.Key(), err)
	}
	return nil
}

// kernelLinks is the real Links over netlink, in the current namespace.
type kernelLinks struct{ h *netlink.Handle }

// NewLinks returns the real Links. Only the route family is opened: the
// default handle also opens XFRM and netfilter sockets, which fail where
// those modules are missing.
func NewLinks() (Links, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	return &kernelLinks{h: h}, nil
}

func (l *kernelLinks) link(name string) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	return link, nil
}

func (l *kernelLinks) EnsureDummy(name string) error {
	link, err := l.link(name)
	if err != nil {
		return err
	}
	if link == nil {
		if err := l.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create dummy interface %s: %w", name, err)
		}
		if link, err = l.link(name); err != nil || link == nil {
			return fmt.Errorf("dummy interface %s vanished after creation: %v", name, err)
		}
	} else if link.Type() != "dummy" {
		return fmt.Errorf("interface %s exists and is a %s, not a dummy: rename it or choose another --ipvs-interface", name, link.Type())
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := l.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return nil
}

func (l *kernelLinks) Addresses(name string) ([]netip.Addr, error) {
	link, err := l.link(name)
	if err != nil || link == nil {
		return nil, err
	}
	addrs, err := l.h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", name, err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip := fromIP(a.IP); !ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out, nil
}

func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}

func (l *kernelLinks) AddAddress(name string, a netip.Addr) error {
	link, err := l.link(name)
	if err != nil {
		return err
	}
	if link == nil {
		return fmt.Errorf("add %s: interface %s missing", a, name)
	}
	addr := &netlink.Addr{IPNet: hostNet(a)}
	if a.Is6() {
		// Usable at once: no duplicate address detection for a VIP.
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := l.h.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", a, name, err)
	}
	return nil
}

func (l *kernelLinks) DelAddress(name string, a netip.Addr) error {
	link, err := l.link(name)
	if err != nil || link == nil {
		return err
	}
	if err := l.h.AddrDel(link, &netlink.Addr{IPNet: hostNet(a)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", a, name, err)
	}
	return nil
}

func (l *kernelLinks) DeleteDummy(name string) error {
	link, err := l.link(name)
	if err != nil || link == nil {
		return err
	}
	if link.Type() != "dummy" {
		return fmt.Errorf("interface %s is a %s, not steelyard's dummy: left alone", name, link.Type())
	}
	if err := l.h.LinkDel(link); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// inConns reads the connection count of a destination's statistics.
func inConns(s mobyipvs.DstStats) uint64 { return uint64(s.Connections) }
