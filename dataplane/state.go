// Package dataplane holds the desired-state model that every steelyard
// dataplane (iptables, IPVS, nftables) consumes, and the views that the
// operator CLI (explain, verify) prints.
//
// The model is deliberately free of Kubernetes types: the controller turns
// Services and EndpointSlices into a State once (weights, splits, readiness),
// and each dataplane only decides how to program that State into the kernel.
package dataplane

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Protocol is an L4 protocol a VIP can carry.
type Protocol string

// The protocols steelyard forwards.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// Lower returns the protocol as iptables, nft and ipset spell it ("tcp",
// "udp", "sctp").
func (p Protocol) Lower() string { return strings.ToLower(string(p)) }

// ServicePortName identifies one port of one Service: "namespace/name:port".
type ServicePortName struct {
	Namespace string
	Name      string
	// Port is the Service port's name, or its number when the port is unnamed.
	Port string
}

// String renders the name the way rule comments and the CLI show it.
func (n ServicePortName) String() string {
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// ParseServicePortName parses "namespace/name:port".
func ParseServicePortName(s string) (ServicePortName, error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" {
		return ServicePortName{}, fmt.Errorf("service port name %q: want namespace/name:port", s)
	}
	name, port, ok := strings.Cut(rest, ":")
	if !ok || name == "" || port == "" {
		return ServicePortName{}, fmt.Errorf("service port name %q: want namespace/name:port", s)
	}
	return ServicePortName{Namespace: ns, Name: name, Port: port}, nil
}

// VIP is the address a client connects to: a Service IP, port and protocol.
type VIP struct {
	IP       netip.Addr
	Port     uint16
	Protocol Protocol
}

// String renders "198.18.0.10:80/TCP".
func (v VIP) String() string {
	return netip.AddrPortFrom(v.IP, v.Port).String() + "/" + string(v.Protocol)
}

// Backend is one endpoint behind a VIP.
//
// Its fields are ordered by size so the struct packs into 88 bytes (104 in
// declaration order): at 10,000 Services x 10 endpoints a port's 10
// Backends take 896 bytes instead of 1,152 (2.4 MiB less per copy,
// BenchmarkHeapAfterFirstSync10kx10).
type Backend struct {
	IP netip.Addr
	// Name is the endpoint's pod name (EndpointSlice targetRef.name), or "".
	Name string
	// NodeName and Zone are where the endpoint runs (EndpointSlice nodeName
	// and zone), for display.
	NodeName string
	Zone     string
	// Weight is the effective weight: the share of new connections is
	// Weight / (sum of the Weights of the backends the traffic's category
	// uses: ClusterBackends or LocalBackends). Zero means "no new
	// connections" (drained by weight 0, not ready, left out by the
	// terminating fallback, or kept away by topology and not local) while
	// established connections keep flowing.
	// It is fractional when a split across Services divides a part among
	// the endpoints of one Service.
	Weight float64
	Port   uint16
	// Ready, Serving and Terminating are the EndpointSlice conditions; they
	// are kept for display and for graceful handling in dataplanes. The
	// readiness rule is already folded into Weight.
	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when the endpoint runs on this node: the only endpoints
	// that receive traffic under a Local traffic policy.
	Local bool
	// LocalOnly is true when cluster-wide traffic leaves this active
	// endpoint out and only Local traffic policies use it: topology
	// (EndpointSlice hints, trafficDistribution) keeps cluster traffic in
	// another zone or node, or it is terminating while other nodes have
	// ready endpoints (kube-proxy's fallback per category).
	LocalOnly bool
}

// Addr returns the backend's IP:port.
func (b Backend) Addr() netip.AddrPort { return netip.AddrPortFrom(b.IP, b.Port) }

// ServicePort is one VIP and the backends its new connections are split across.
//
// Besides the VIP (the clusterIP), a Service port can be reached through
// external entry points: the node port on the node's addresses, external IPs
// and load-balancer ingress IPs. Those follow the external traffic policy;
// the VIP follows the internal one.
type ServicePort struct {
	Name     ServicePortName
	VIP      VIP
	Backends []Backend
	// NodePort is the port opened on the node's addresses; 0 for none.
	NodePort uint16
	// ExternalIPs are spec.externalIPs of the VIP's family.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are status.loadBalancer.ingress[].ip of the VIP's family.
	LoadBalancerIPs []netip.Addr
	// SourceRanges are spec.loadBalancerSourceRanges: when set, only these
	// clients may use the LoadBalancerIPs; others are dropped.
	SourceRanges []netip.Prefix
	// ExternalLocal is externalTrafficPolicy Local: external traffic goes to
	// Local endpoints only, with the client's address preserved, and is
	// dropped when there is none.
	ExternalLocal bool
	// InternalLocal is internalTrafficPolicy Local: traffic to the VIP goes
	// to Local endpoints only and is dropped when there is none.
	InternalLocal bool
	// HealthCheckNodePort is the port where this node reports its number of
	// local endpoints (ExternalLocal LoadBalancer Services); 0 for none.
	HealthCheckNodePort uint16
	// AffinitySeconds is sessionAffinity ClientIP's timeout: a client keeps
	// its backend for that long after its last new connection. 0: none.
	AffinitySeconds int
	// Scheduler is the IPVS scheduler from the annotation, "" = node default.
	Scheduler string
	// RejectWeight is a share of new connections that is refused, weighed
	// like a backend: RejectWeight / (RejectWeight + TotalWeight) of them.
	// It is the part of a Gateway API route's invalid backendRefs, which
	// the spec says keep their weight and fail their connections. It
	// applies only while the port has an active backend (without one every
	// connection is refused anyway).
	RejectWeight float64
}

// RejectShare returns the fraction (0..1) of the new connections through bs
// that RejectWeight refuses; 0 when bs is empty.
func (s *ServicePort) RejectShare(bs []Backend) float64 {
	sum := SumWeights(bs)
	if s.RejectWeight <= 0 || sum == 0 {
		return 0
	}
	return s.RejectWeight / (s.RejectWeight + sum)
}

// HasExternal reports whether the port has an external entry point.
func (s *ServicePort) HasExternal() bool {
	return s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
}

// ClusterBackends returns the backends that cluster-wide traffic is split
// across: active and not LocalOnly; stable order. The controller never
// leaves it empty while LocalBackends has one. Read only: it may be
// s.Backends itself (see Active).
func (s *ServicePort) ClusterBackends() []Backend {
	return s.filter(func(b *Backend) bool { return b.Weight > 0 && !b.LocalOnly })
}

// LocalBackends returns the active backends on this node, which Local
// traffic policies use (the controller has already chosen between ready
// and terminating ones); stable order. Read only (see Active).
func (s *ServicePort) LocalBackends() []Backend {
	return s.filter(func(b *Backend) bool { return b.Weight > 0 && b.Local })
}

// InternalBackends returns the backends of traffic to the VIP.
func (s *ServicePort) InternalBackends() []Backend {
	if s.InternalLocal {
		return s.LocalBackends()
	}
	return s.ClusterBackends()
}

// ExternalBackends returns the backends of traffic from off the cluster to
// an external entry point.
func (s *ServicePort) ExternalBackends() []Backend {
	if s.ExternalLocal {
		return s.LocalBackends()
	}
	return s.ClusterBackends()
}

// Family returns 4 or 6, the IP family of the VIP.
func (s *ServicePort) Family() int {
	if s.VIP.IP.Is4() {
		return 4
	}
	return 6
}

// Active returns the backends that receive new connections (Weight > 0), in
// a stable order (by IP, then port). Read only: when every backend is
// active and sorted (as the controller builds them) it is s.Backends
// itself, capped so that an append copies. A copy per call was 31 MB of
// the 470 MB a first sync of 10,000 Services x 10 allocates (render calls
// it three times per port; BenchmarkMemoryFromAPI10kx10).
func (s *ServicePort) Active() []Backend {
	return s.filter(func(b *Backend) bool { return b.Weight > 0 })
}

// filter returns the backends keep accepts, sorted: s.Backends itself
// (capped) when it accepts all of them in order, else a copy; nil for none.
func (s *ServicePort) filter(keep func(*Backend) bool) []Backend {
	n := 0
	for i := range s.Backends {
		if keep(&s.Backends[i]) {
			n++
		}
	}
	switch {
	case n == 0:
		return nil
	case n == len(s.Backends) && backendsSorted(s.Backends):
		return s.Backends[:n:n]
	}
	out := make([]Backend, 0, n)
	for i := range s.Backends {
		if keep(&s.Backends[i]) {
			out = append(out, s.Backends[i])
		}
	}
	sortBackends(out)
	return out
}

// TotalWeight returns the sum of the weights of the active backends.
func (s *ServicePort) TotalWeight() float64 {
	return SumWeights(s.Backends)
}

// SumWeights returns the sum of the positive weights of bs.
func SumWeights(bs []Backend) float64 {
	var sum float64
	for _, b := range bs {
		if b.Weight > 0 {
			sum += b.Weight
		}
	}
	return sum
}

// Equal reports whether two Service ports describe the same thing.
func (s *ServicePort) Equal(o *ServicePort) bool {
	return s.Name == o.Name && s.VIP == o.VIP && s.Scheduler == o.Scheduler &&
		s.NodePort == o.NodePort && slices.Equal(s.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(s.LoadBalancerIPs, o.LoadBalancerIPs) && slices.Equal(s.SourceRanges, o.SourceRanges) &&
		s.ExternalLocal == o.ExternalLocal && s.InternalLocal == o.InternalLocal &&
		s.HealthCheckNodePort == o.HealthCheckNodePort && s.AffinitySeconds == o.AffinitySeconds &&
		s.RejectWeight == o.RejectWeight && slices.Equal(s.Backends, o.Backends)
}

func sortBackends(bs []Backend) {
	if backendsSorted(bs) {
		return
	}
	sort.SliceStable(bs, func(i, j int) bool { return backendLess(&bs[i], &bs[j]) })
}

func backendLess(a, b *Backend) bool {
	if c := a.IP.Compare(b.IP); c != 0 {
		return c < 0
	}
	if a.Port != b.Port {
		return a.Port < b.Port
	}
	return a.Name < b.Name
}

func backendsSorted(bs []Backend) bool {
	for i := 1; i < len(bs); i++ {
		if backendLess(&bs[i], &bs[i-1]) {
			return false
		}
	}
	return true
}

// State is the whole desired state of a node: every Service port steelyard
// programs. Dataplanes apply a State as one unit.
//
// The slices a ServicePort holds (Backends, ExternalIPs, LoadBalancerIPs,
// SourceRanges) are never written once the State is handed to a
// dataplane: the controller builds new ones for every change, and
// dataplanes record a port by sharing them (Clone). Whoever builds a
// State by hand builds a new slice to change one.
type State struct {
	Services []ServicePort
}

// Clone returns a copy of s that a dataplane can record: the struct is
// copied (the State's array is reused by the next one), its slices are
// shared, since nobody writes them once built (see State). The deep copy
// it was kept the Backends twice, the Builder's and the record's: 11.5
// MiB of the heap after the first sync of 10,000 Services x 10
// (BenchmarkHeapAfterFirstSync10kx10).
func (s *ServicePort) Clone() *ServicePort {
	c := *s
	return &c
}

// Detach gives s slices of its own (copies), so that changing them in
// place leaves alone what a dataplane recorded from s (Clone shares
// them): what a caller does before it edits a port it already synced.
func (s *ServicePort) Detach() {
	s.Backends = slices.Clone(s.Backends)
	s.ExternalIPs = slices.Clone(s.ExternalIPs)
	s.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
	s.SourceRanges = slices.Clone(s.SourceRanges)
}

// PortsOf returns the ports of Service n in s, which must be sorted
// (Sort): a binary search, since the ports of one Service, whose names
// share the prefix "namespace/name:", are next to each other.
func (s State) PortsOf(n ServiceName) []ServicePort {
	prefix := n.Namespace + "/" + n.Name + ":"
	i := sort.Search(len(s.Services), func(i int) bool { return s.Services[i].Name.String() >= prefix })
	j := i
	for j < len(s.Services) && strings.HasPrefix(s.Services[j].Name.String(), prefix) {
		j++
	}
	return s.Services[i:j]
}

// Sort orders the Service ports by name, so renderings are deterministic.
func (s *State) Sort() {
	sort.SliceStable(s.Services, func(i, j int) bool {
		a, b := s.Services[i], s.Services[j]
		if a.Name != b.Name {
			return a.Name.String() < b.Name.String()
		}
		return a.VIP.String() < b.VIP.String()
	})
	for i := range s.Services {
		sortBackends(s.Services[i].Backends)
	}
}
