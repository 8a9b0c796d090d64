// Package sandbox builds a throw-away Kubernetes node out of network
// namespaces, so the kernel tests, the demo and later suites can run the
// steelyard agent against real iptables, conntrack and traffic without
// touching the machine they run on.
//
// Nothing here changes the root network namespace: every interface, address,
// route, sysctl and rule lives in a namespace the sandbox creates, and Close
// deletes them all. Names carry the owner's PID, and New removes the
// namespaces of owners that have died (a test binary killed by Ctrl-C).
//
// # IP plan
//
// Only 198.18.0.0/15 (RFC 2544, benchmarking) is used; the sandbox refuses
// anything else.
//
//	198.18.0.0/16    Service VIPs. Never assigned to an interface: the node
//	                 routes the whole /16 to its dummy interface, so
//	                 locally-originated packets to a VIP have a route and
//	                 reach the agent's DNAT in OUTPUT.
//	198.19.0.1/32    the node, on the dummy interface "node0" in the node
//	                 namespace (pods use it as their gateway, as with Calico).
//	                 Kernels without the dummy driver get an ifb device
//	                 instead, which drops what it is sent just the same.
//	198.19.1.0 -     pods: one namespace each, a routed /32 veth. The e2e
//	198.19.127.255   tests run the agent with --cluster-cidr 198.19.0.0/17.
//	198.19.160.0/19  the client pool: extra /32 addresses of the first
//	                 client, routed to it by the node (AddPoolAddrs).
//	198.19.254.0/24  the client LAN: node side .1, clients .2, .3, ...
//	                 (outside the cluster CIDR, so the agent masquerades them).
//
// Topology:
//
//	client ns "<p>-c1"            node ns "<p>-node"                  pod ns "<p>-pod-web-1"
//	eth0 198.19.254.2/24 ──veth── syc1 198.19.254.1/24
//	default via 198.19.254.1      node0 (dummy) 198.19.0.1/32
//	                              198.18.0.0/16 dev node0
//	                              198.19.1.2/32 dev syp1 ──veth────── eth0 198.19.1.2/32
//	                                                                  198.19.0.1 dev eth0
//	                                                                  default via 198.19.0.1 dev eth0 onlink
//
// where <p> is "sy<pid>-<n>" (owner PID, sandbox number in that process).
//
// Pods answer with their name: on every port given to AddPod a TCP server
// writes "<name>\n" on accept and then echoes each line until EOF, and a UDP
// server replies "<name>\n" to every datagram. The servers run in this
// process, their sockets created inside the pod's namespace.
//
// The package needs root and the ip (iproute2) command; it does not depend
// on package testing except for NewT, so the demo uses it as well.
package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The IP plan as values; see the package comment.
var (
	// VIPRange holds every Service VIP.
	VIPRange = netip.MustParsePrefix("198.18.0.0/16")
	// HostRange holds the node, pods and clients.
	HostRange = netip.MustParsePrefix("198.19.0.0/16")
	// ClusterCIDR holds the pods; pass it to the agent as --cluster-cidr.
	ClusterCIDR = netip.MustParsePrefix("198.19.0.0/17")
	// ClientLAN is the clients' subnet.
	ClientLAN = netip.MustParsePrefix("198.19.254.0/24")
	// ClientPool holds more client addresses, outside the cluster CIDR
	// and the client LAN, routed to the first client (AddPoolAddrs).
	ClientPool = netip.MustParsePrefix("198.19.160.0/19")
	// NodeIP is the node's address (on its dummy interface).
	NodeIP = netip.MustParseAddr("198.19.0.1")
	// NodeLANIP is the node's address on the client LAN.
	NodeLANIP = netip.MustParseAddr("198.19.254.1")
)

// Interface names inside the node namespace.
const (
	// NodeDummy holds NodeIP and the route to VIPRange.
	NodeDummy = "node0"
	// Node-side veths are "syc<n>" for clients and "syp<n>" for pods, each
	// with an alias naming the other end ("client:198.19.254.2", "pod:web-1").
	clientVethPrefix = "syc"
	podVethPrefix    = "syp"
)

// Options configure a Sandbox. The zero value is fine.
type Options struct {
	// Prefix starts every namespace name; default "sy". Leftovers are
	// recognised as <Prefix><pid>-... with a PID that no longer runs.
	Prefix string
	// Dir receives the agent logs; default a new temporary directory, which
	// Close removes.
	Dir string
	// Logf, when set, receives one line per step (t.Logf, log.Printf).
	Logf func(format string, args ...any)
}

// Sandbox is one node namespace with its clients and pods.
type Sandbox struct {
	// Name is the common prefix of the namespace names, "sy<pid>-<n>".
	Name string
	// Node is the node namespace, where the agent runs.
	Node *NS
	// Dir holds the agent logs.
	Dir string
	// NodeDeviceKind is the link type of NodeDummy: "dummy", or "ifb" when
	// the kernel has no dummy driver.
	NodeDeviceKind string

	opts       Options
	ownDir     bool
	mu         sync.Mutex
	namespaces []*NS // creation order; Close deletes in reverse
	clients    []*NS
	pods       map[string]*Pod
	podOrder   []*Pod
	agents     []*Agent
	closed     bool
}

var (
	registryMu sync.Mutex
	registry   = map[*Sandbox]bool{}
	sequence   int
)

// New creates the node namespace (lo up, the dummy interface with NodeIP and
// the route to VIPRange) after removing the leftovers of dead owners. Call
// Close when done, also on failure paths; see CloseOnSignal and NewT.
func New(opts Options) (*Sandbox, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("sandbox: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("sandbox: the ip command (iproute2) is needed: %w", err)
	}
	if opts.Prefix == "" {
		opts.Prefix = "sy"
	}
	if !regexp.MustCompile(`^[a-z]{1,8}$`).MatchString(opts.Prefix) {
		return nil, fmt.Errorf("sandbox: prefix %q: want 1-8 lower-case letters", opts.Prefix)
	}
	if err := RemoveLeftovers(opts.Prefix, opts.Logf); err != nil {
		return nil, err
	}
	registryMu.Lock()
	sequence++
	s := &Sandbox{
		Name: fmt.Sprintf("%s%d-%d", opts.Prefix, os.Getpid(), sequence),
		opts: opts,
		pods: map[string]*Pod{},
		Dir:  opts.Dir,
	}
	registry[s] = true
	registryMu.Unlock()

	if s.Dir == "" {
		dir, err := os.MkdirTemp("", s.Name+"-")
		if err != nil {
			s.Close()
			return nil, err
		}
		s.Dir, s.ownDir = dir, true
	}
	node, err := s.newNS("node")
	if err != nil {
		s.Close()
		return nil, err
	}
	s.Node = node
	// dummy, or ifb on kernels built without it (CONFIG_DUMMY unset, as on
	// some VM kernels): an ifb device that no tc rule redirects to drops
	// every packet sent to it, exactly like dummy.
	s.NodeDeviceKind = "dummy"
	if err := node.ip("link", "add", NodeDummy, "type", "dummy"); err != nil {
		if err2 := node.ip("link", "add", NodeDummy, "type", "ifb"); err2 != nil {
			s.Close()
			return nil, fmt.Errorf("sandbox: neither dummy nor ifb devices are available: %w; %w", err, err2)
		}
		s.NodeDeviceKind = "ifb"
	}
	err = node.ipBatch(
		"addr add "+NodeIP.String()+"/32 dev "+NodeDummy,
		"link set "+NodeDummy+" up",
		"route add "+VIPRange.String()+" dev "+NodeDummy,
	)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.logf("sandbox %s: node namespace %s, node %s, VIPs %s via %s (%s)", s.Name, node.Name, NodeIP, VIPRange, NodeDummy, s.NodeDeviceKind)
	return s, nil
}

func (s *Sandbox) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// newNS creates the namespace <s.Name>-<suffix> with lo up.
func (s *Sandbox) newNS(suffix string) (*NS, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("sandbox: closed")
	}
	n, err := createNS(s.Name + "-" + suffix)
	if err != nil {
		return nil, err
	}
	s.namespaces = append(s.namespaces, n)
	return n, nil
}

// AddClient adds a client namespace on the client LAN with address ip (in
// ClientLAN; the zero Addr picks the next free one: .2, .3, ...) and a
// default route via the node. Its ephemeral port range is widened to
// 1024-65535 (inside the client namespace only), so tens of thousands of
// connections to one VIP do not run out of ports while earlier ones sit in
// TIME_WAIT.
func (s *Sandbox) AddClient(ip netip.Addr) (*NS, error) {
	s.mu.Lock()
	k := len(s.clients) + 1
	s.mu.Unlock()
	if !ip.IsValid() {
		ip = netip.AddrFrom4([4]byte{198, 19, 254, byte(1 + k)})
	}
	if !ip.Is4() || !ClientLAN.Contains(ip) || ip == NodeLANIP || ip == ClientLAN.Addr() || ip.As4()[3] == 255 {
		return nil, fmt.Errorf("sandbox: client address %s: want a host address in %s other than %s", ip, ClientLAN, NodeLANIP)
	}
	n, err := s.newNS(fmt.Sprintf("c%d", k))
	if err != nil {
		return nil, err
	}
	n.Addr = ip
	veth := fmt.Sprintf("%s%d", clientVethPrefix, k)
	plen := strconv.Itoa(ClientLAN.Bits())
	// The first client's veth carries the LAN prefix; later ones get the
	// node address as a /32 and a host route to their client, which wins
	// over the prefix route of syc1.
	nodeSide := []string{
		"link add " + veth + " type veth peer name eth0 netns " + n.Name,
		"link set " + veth + " alias client:" + ip.String(),
		"addr add " + NodeLANIP.String() + "/" + plen + " dev " + veth,
		"link set " + veth + " up",
	}
	if k > 1 {
		nodeSide[2] = "addr add " + NodeLANIP.String() + "/32 dev " + veth
		nodeSide = append(nodeSide, "route add "+ip.String()+"/32 dev "+veth)
	}
	if err := s.Node.ipBatch(nodeSide...); err != nil {
		return nil, err
	}
	if err := n.ipBatch(
		"addr add "+ip.String()+"/"+plen+" dev eth0",
		"link set eth0 up",
		"route add default via "+NodeLANIP.String()+" dev eth0",
	); err != nil {
		return nil, err
	}
	if err := n.WriteSysctl("net/ipv4/ip_local_port_range", "1024 65535"); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.clients = append(s.clients, n)
	s.mu.Unlock()
	s.logf("sandbox %s: client %s in %s (node side %s)", s.Name, ip, n.Name, veth)
	return n, nil
}

// Clients returns the client namespaces in the order they were added.
func (s *Sandbox) Clients() []*NS {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*NS(nil), s.clients...)
}

// AddPod adds a pod namespace named name with the routed /32 address ip (in
// HostRange, outside ClientLAN) and starts its TCP and UDP servers on ports.
func (s *Sandbox) AddPod(name string, ip netip.Addr, ports ...uint16) (*Pod, error) {
	if !regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`).MatchString(name) {
		return nil, fmt.Errorf("sandbox: pod name %q: want a DNS label", name)
	}
	if !ip.Is4() || !HostRange.Contains(ip) || ClientLAN.Contains(ip) || ip == NodeIP || ip.As4()[3] == 0 || ip.As4()[3] == 255 {
		return nil, fmt.Errorf("sandbox: pod %s address %s: want a host address in %s outside %s, not %s", name, ip, HostRange, ClientLAN, NodeIP)
	}
	s.mu.Lock()
	if _, dup := s.pods[name]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox: pod %s exists", name)
	}
	for _, p := range s.podOrder {
		if p.IP == ip {
			s.mu.Unlock()
			return nil, fmt.Errorf("sandbox: pod %s: address %s belongs to pod %s", name, ip, p.Name)
		}
	}
	k := len(s.podOrder) + 1
	s.mu.Unlock()

	n, err := s.newNS("pod-" + name)
	if err != nil {
		return nil, err
	}
	n.Addr = ip
	veth := fmt.Sprintf("%s%d", podVethPrefix, k)
	if err := s.Node.ipBatch(
		"link add "+veth+" type veth peer name eth0 netns "+n.Name,
		"link set "+veth+" alias pod:"+name,
		"link set "+veth+" up",
		"route add "+ip.String()+"/32 dev "+veth,
	); err != nil {
		return nil, err
	}
	if err := n.ipBatch(
		"addr add "+ip.String()+"/32 dev eth0",
		"link set eth0 up",
		"route add "+NodeIP.String()+" dev eth0",
		"route add default via "+NodeIP.String()+" dev eth0 onlink",
	); err != nil {
		return nil, err
	}
	p := &Pod{Name: name, IP: ip, Ports: append([]uint16(nil), ports...), NS: n, Veth: veth}
	if err := p.start(); err != nil {
		p.stop()
		return nil, fmt.Errorf("sandbox: pod %s: %w", name, err)
	}
	s.mu.Lock()
	s.pods[name] = p
	s.podOrder = append(s.podOrder, p)
	s.mu.Unlock()
	s.logf("sandbox %s: pod %s %s ports %v in %s (node side %s)", s.Name, name, ip, ports, n.Name, veth)
	return p, nil
}

// Pod returns the pod named name, or nil.
func (s *Sandbox) Pod(name string) *Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods[name]
}

// Pods returns the pods in the order they were added.
func (s *Sandbox) Pods() []*Pod {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Pod(nil), s.podOrder...)
}

// Exec runs argv in namespace n with `ip netns exec` and returns its
// standard output; see NS.Exec.
func (s *Sandbox) Exec(n *NS, argv ...string) (string, error) {
	return n.Exec(argv...)
}

// Close stops the agents, the pod servers and open connections, and deletes
// every namespace of the sandbox (with them their interfaces, routes and
// rules). It is safe to call more than once.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	agents := s.agents
	pods := s.podOrder
	namespaces := s.namespaces
	s.mu.Unlock()

	var errs []error
	for _, a := range agents {
		if err := a.Stop(); err != nil && !errors.Is(err, ErrAgentExited) {
			s.logf("sandbox %s: stopping agent: %v", s.Name, err)
		}
	}
	for _, p := range pods {
		p.stop()
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if err := namespaces[i].delete(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.ownDir {
		if err := os.RemoveAll(s.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	registryMu.Lock()
	delete(registry, s)
	registryMu.Unlock()
	s.logf("sandbox %s: removed", s.Name)
	return errors.Join(errs...)
}

// CloseAll closes every sandbox of this process that is still open.
func CloseAll() {
	registryMu.Lock()
	open := make([]*Sandbox, 0, len(registry))
	for s := range registry {
		open = append(open, s)
	}
	registryMu.Unlock()
	for _, s := range open {
		s.Close()
	}
}

// RemoveLeftovers deletes the namespaces named <prefix><pid>-... whose owner
// PID no longer runs, after killing the processes still inside them (agents
// a killed test binary left behind), and their agent log directories in
// the temporary directory. logf may be nil.
func RemoveLeftovers(prefix string, logf func(string, ...any)) error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(prefix) + `([0-9]+)-`)
	var errs []error
	for _, e := range entries {
		m := re.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		n := &NS{Name: e.Name(), path: filepath.Join(netnsDir, e.Name())}
		if out, err := exec.Command("ip", "netns", "pids", n.Name).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if p, err := strconv.Atoi(f); err == nil && p > 1 && p != os.Getpid() {
					syscall.Kill(p, syscall.SIGKILL)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := n.delete(); err != nil {
			errs = append(errs, err)
			continue
		}
		if logf != nil {
			logf("sandbox: removed leftover namespace %s (owner PID %d is gone)", n.Name, pid)
		}
	}
	// Agent log directories that New made for sandboxes of dead owners.
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"[0-9]*-[0-9]*-*"))
	for _, d := range dirs {
		m := re.FindStringSubmatch(filepath.Base(d))
		if m == nil {
			continue
		}
		if pid, err := strconv.Atoi(m[1]); err == nil && pid > 0 && !processAlive(pid) {
			os.RemoveAll(d)
		}
	}
	return errors.Join(errs...)
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// IsRoot reports whether the process can create network namespaces.
func IsRoot() bool { return os.Geteuid() == 0 }
