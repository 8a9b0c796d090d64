package sandbox

// Helpers for the kube-proxy parity tests: IPv6 in the sandbox (the
// benchmarking range 2001:2::/48 only), servers that tell the client
// address they see, extra client source addresses (many clients from one
// namespace), and traffic that is not limited to IPv4.
//
// IPv6 plan (inside 2001:2::/48):
//
//	2001:2::/64          Service VIPs, routed to node0 like VIPRange
//	2001:2:0:fe::1/128   the node, on node0
//	2001:2:0:fd::/64     the client LAN: node side ::1 (on syc1), clients ::2, ...
//	2001:2:0:1::/64      pods: 2001:2:0:1::<n>/128 on the pod's eth0, routed by
//	                     the node; each pod's default route goes via fe80::1,
//	                     a fixed link-local address on the node side of its veth
//
// Addresses are added with nodad, so they are usable at once.

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// The IPv6 plan as values.
var (
	// IPv6Range holds every IPv6 address the sandbox uses.
	IPv6Range = netip.MustParsePrefix("2001:2::/48")
	// VIPRange6 holds the IPv6 Service VIPs.
	VIPRange6 = netip.MustParsePrefix("2001:2::/64")
	// NodeIP6 is the node's IPv6 address (on its dummy interface).
	NodeIP6 = netip.MustParseAddr("2001:2:0:fe::1")
	// ClientLAN6 is the clients' IPv6 subnet; NodeLANIP6 the node's address on it.
	ClientLAN6 = netip.MustParsePrefix("2001:2:0:fd::/64")
	NodeLANIP6 = netip.MustParseAddr("2001:2:0:fd::1")
	// ClusterCIDR6 holds the IPv6 pod addresses.
	ClusterCIDR6 = netip.MustParsePrefix("2001:2:0:1::/64")
)

// podGateway6 is the link-local address of the node side of every pod veth.
const podGateway6 = "fe80::1"

// checkAnyDst accepts the sandbox's IPv4 and IPv6 ranges.
func checkAnyDst(dst netip.AddrPort) error {
	if !dst.IsValid() || dst.Port() == 0 || !(TrafficRange.Contains(dst.Addr()) || IPv6Range.Contains(dst.Addr())) {
		return fmt.Errorf("sandbox: destination %s is outside %s and %s", dst, TrafficRange, IPv6Range)
	}
	return nil
}

// EnableIPv6 gives the node its IPv6 address and VIP route. Call it before
// AddClient6 and AddPod6.
func (s *Sandbox) EnableIPv6() error {
	if err := s.Node.WriteSysctl("net/ipv6/conf/all/disable_ipv6", "0"); err != nil {
		return err
	}
	return s.Node.ipBatch(
		"addr add "+NodeIP6.String()+"/128 dev "+NodeDummy+" nodad",
		"route add "+VIPRange6.String()+" dev "+NodeDummy,
	)
}

// AddClient6 gives client n (made by AddClient; its veth is syc<k>) the
// IPv6 address ip in ClientLAN6, with the node's LAN address on the node
// side and a default route through it.
func (s *Sandbox) AddClient6(n *NS, ip netip.Addr) error {
	if !ClientLAN6.Contains(ip) || ip == NodeLANIP6 || ip == ClientLAN6.Addr() {
		return fmt.Errorf("sandbox: client IPv6 address %s: want a host in %s other than %s", ip, ClientLAN6, NodeLANIP6)
	}
	k := -1
	for i, c := range s.Clients() {
		if c == n {
			k = i + 1
		}
	}
	if k < 0 {
		return errors.New("sandbox: AddClient6: not a client of this sandbox")
	}
	veth := fmt.Sprintf("%s%d", clientVethPrefix, k)
	nodeSide := []string{"addr add " + NodeLANIP6.String() + "/64 dev " + veth + " nodad"}
	if k > 1 {
		nodeSide = []string{"route add " + ip.String() + "/128 dev " + veth}
	}
	if err := s.Node.ipBatch(nodeSide...); err != nil {
		return err
	}
	return n.ipBatch(
		"addr add "+ip.String()+"/64 dev eth0 nodad",
		"route add ::/0 via "+NodeLANIP6.String()+" dev eth0",
	)
}

// AddPod6 gives pod p the IPv6 address ip in ClusterCIDR6 and a server on
// each of its ports answering "<name> <client address>" (see ServeSource).
func (s *Sandbox) AddPod6(p *Pod, ip netip.Addr) error {
	if !ClusterCIDR6.Contains(ip) {
		return fmt.Errorf("sandbox: pod IPv6 address %s: want one in %s", ip, ClusterCIDR6)
	}
	if err := s.Node.ipBatch(
		"addr add "+podGateway6+"/64 dev "+p.Veth+" nodad",
		"route add "+ip.String()+"/128 dev "+p.Veth,
	); err != nil {
		return err
	}
	return p.NS.ipBatch(
		"addr add "+ip.String()+"/128 dev eth0 nodad",
		"route add ::/0 via "+podGateway6+" dev eth0",
	)
}

// ServeSource starts a TCP server on port (both families) in the pod's
// namespace that writes "<pod name> <client address>\n" on accept and
// closes: the client address is the one the pod sees, so tests can tell
// whether it was preserved or masqueraded. The pod's Close stops it.
func (p *Pod) ServeSource(port uint16) error {
	var l net.Listener
	err := p.NS.Do(func() error {
		var err error
		l, err = net.Listen("tcp", "[::]:"+strconv.Itoa(int(port)))
		return err
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		l.Close()
		return errors.New("sandbox: pod stopped")
	}
	p.listeners = append(p.listeners, l)
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			src := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "%s %s\n", p.Name, src)
			c.Close()
		}
	}()
	return nil
}

// AddAddrs adds count more IPv4 addresses from the client LAN to client n,
// starting at first, and returns them: one namespace can then act as many
// clients (session affinity is per client address). The node reaches them
// on the LAN, so n must be the first client (whose veth holds the LAN
// prefix).
func (s *Sandbox) AddAddrs(n *NS, first netip.Addr, count int) ([]netip.Addr, error) {
	if cs := s.Clients(); len(cs) == 0 || cs[0] != n {
		return nil, errors.New("sandbox: AddAddrs: only the first client holds the LAN prefix")
	}
	var out []netip.Addr
	var cmds []string
	a := first
	for i := 0; i < count; i++ {
		if !ClientLAN.Contains(a) || a == NodeLANIP || a.As4()[3] == 255 || a.As4()[3] == 0 {
			return nil, fmt.Errorf("sandbox: client address %s: not a host in %s", a, ClientLAN)
		}
		cmds = append(cmds, "addr add "+a.String()+"/32 dev eth0")
		out = append(out, a)
		a = a.Next()
	}
	if err := n.ipBatch(cmds...); err != nil {
		return nil, err
	}
	return out, nil
}

// AddPoolAddrs adds the first count addresses of ClientPool to client n
// (the first client) and routes the pool to it from the node, for tests
// that need more distinct client addresses than the client LAN holds (a
// share of new clients under session affinity, counted one connection per
// address). Addresses ending in .0 or .255 are left out.
func (s *Sandbox) AddPoolAddrs(n *NS, count int) ([]netip.Addr, error) {
	if cs := s.Clients(); len(cs) == 0 || cs[0] != n {
		return nil, errors.New("sandbox: AddPoolAddrs: only the first client")
	}
	var out []netip.Addr
	var cmds []string
	for a := ClientPool.Addr(); len(out) < count; a = a.Next() {
		if !ClientPool.Contains(a) {
			return nil, fmt.Errorf("sandbox: AddPoolAddrs: %s holds fewer than %d usable addresses", ClientPool, count)
		}
		if b := a.As4()[3]; b == 0 || b == 255 {
			continue
		}
		cmds = append(cmds, "addr add "+a.String()+"/32 dev eth0")
		out = append(out, a)
	}
	if err := n.ipBatch(cmds...); err != nil {
		return nil, err
	}
	if err := s.Node.ip("route", "add", ClientPool.String(), "via", n.Addr.String()); err != nil {
		return nil, err
	}
	return out, nil
}

// FirstLine opens one TCP connection from this namespace to dst (IPv4 or
// IPv6), from source address src unless it is the zero Addr, and returns
// the first line the server writes.
func (n *NS) FirstLine(src netip.Addr, dst netip.AddrPort, timeout time.Duration) (string, error) {
	if err := checkAnyDst(dst); err != nil {
		return "", err
	}
	var line string
	err := n.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err := d.Dial("tcp", dst.String())
		if err != nil {
			return err
		}
		c.(*net.TCPConn).SetLinger(0)
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		line, err = bufio.NewReader(c).ReadString('\n')
		line = strings.TrimSpace(line)
		return err
	})
	return line, err
}

// TCPConnsAny is TCPConns for IPv4 or IPv6 destinations: the first word of
// each server's first line is counted (a pod name, also from ServeSource).
func (n *NS) TCPConnsAny(dst netip.AddrPort, count int, load Load) (Result, error) {
	if err := checkAnyDst(dst); err != nil {
		return Result{}, err
	}
	load = load.withDefaults()
	d := net.Dialer{Timeout: load.Timeout}
	return n.run("tcp", dst, count, load, func() (string, error) {
		c, err := d.Dial("tcp", dst.String())
		if err != nil {
			return "", err
		}
		c.(*net.TCPConn).SetLinger(0)
		defer c.Close()
		c.SetDeadline(time.Now().Add(load.Timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", err
		}
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		return name, nil
	})
}
