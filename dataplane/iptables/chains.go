package iptables

import (
	"crypto/sha256"
	"encoding/base32"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Top-level chain names below are part of the released interface: never
// rename them. ChainPrefix (internal/iptables) starts every one.

// Top-level chains.
const (
	// ChainServices (nat) sends each VIP to its Service chain. (filter) rejects
	// new connections to VIPs without endpoints.
	ChainServices Chain = "STEELYARD-SERVICES"
	// ChainPostrouting (nat) masquerades packets marked for it.
	ChainPostrouting Chain = "STEELYARD-POSTROUTING"
	// ChainMarkMasq (nat) marks a packet for masquerading.
	ChainMarkMasq Chain = "STEELYARD-MARK-MASQ"
	// ChainForward (filter) accepts steelyard's traffic on hosts whose FORWARD
	// policy is DROP.
	ChainForward Chain = "STEELYARD-FORWARD"
	// ChainNodePorts (nat) sends each node port to its external chain;
	// STEELYARD-SERVICES jumps here for the node's addresses. (filter)
	// refuses or drops node ports that have no (local) endpoint.
	ChainNodePorts Chain = "STEELYARD-NODEPORTS"
)

const (
	svcPrefix = "STEELYARD-SVC-"
	sepPrefix = "STEELYARD-SEP-"
	svlPrefix = "STEELYARD-SVL-"
	extPrefix = "STEELYARD-EXT-"
	fwPrefix  = "STEELYARD-FW-"
	// iptables chain names hold at most 28 characters; prefix (14) + 14.
	hashLen = 14
)

// ServiceChain returns the chain of one Service port: a stable hash of its
// name and protocol, so it survives restarts and renames nothing.
func ServiceChain(name dataplane.ServicePortName, proto dataplane.Protocol) Chain {
	return Chain(svcPrefix + hash(name.String()+"/"+string(proto)))
}

// LocalChain returns the chain that splits a Service port's traffic across
// its endpoints on this node (a Local traffic policy).
func LocalChain(name dataplane.ServicePortName, proto dataplane.Protocol) Chain {
	return Chain(svlPrefix + hash(name.String()+"/"+string(proto)))
}

// ExternalChain returns the chain of a Service port's external entry points
// (node port, external IPs, load-balancer IPs): it applies the external
// traffic policy.
func ExternalChain(name dataplane.ServicePortName, proto dataplane.Protocol) Chain {
	return Chain(extPrefix + hash(name.String()+"/"+string(proto)))
}

// FirewallChain returns the chain that lets only loadBalancerSourceRanges
// through to a Service port's load-balancer IPs.
func FirewallChain(name dataplane.ServicePortName, proto dataplane.Protocol) Chain {
	return Chain(fwPrefix + hash(name.String()+"/"+string(proto)))
}

// EndpointChain returns the chain of one backend of one Service port.
func EndpointChain(name dataplane.ServicePortName, proto dataplane.Protocol, b dataplane.Backend) Chain {
	return Chain(sepPrefix + hash(name.String()+"/"+string(proto)+"/"+b.Addr().String()))
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:hashLen]
}
