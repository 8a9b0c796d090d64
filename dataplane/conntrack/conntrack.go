// Package conntrack deletes the kernel's connection-tracking entries that
// would keep sending a flow to an endpoint that is gone.
//
// UDP has no connection teardown: once conntrack has translated a flow from
// a VIP to an endpoint, every later datagram of that flow (same 5-tuple)
// keeps that translation until the entry times out (120 s for a flow that
// saw replies, refreshed by each datagram). A client that sends steadily
// never lets it time out, so it keeps talking to a pod that left the
// Service, or was deleted (kubernetes#59368). The cure is to delete exactly
// those entries; the next datagram then takes a new, current decision.
//
// Deletions are always narrow: a Filter must name an address (or this
// node's own addresses on one port, for a node port), and an empty Filter
// is refused, so nothing here can flush the table (live UDP flows
// such as QUIC connections must survive an agent restart: kubernetes#122740).
//
// Interface has a netlink implementation (New) and a Fake that keeps flows
// in memory and applies the same matching, for unit tests.
package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Flow is one conntrack entry: the original tuple (as the client sent it)
// and the reply tuple (as the answer will come back). For a flow DNATed
// from a VIP to an endpoint, OrigDst is the VIP and ReplySrc the endpoint.
type Flow struct {
	Protocol dataplane.Protocol
	OrigSrc  netip.AddrPort
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
	ReplyDst netip.AddrPort
}

// String renders the flow like `conntrack -L` does, shortened.
func (f Flow) String() string {
	return fmt.Sprintf("%s %s -> %s | %s -> %s", f.Protocol, f.OrigSrc, f.OrigDst, f.ReplySrc, f.ReplyDst)
}

// Filter selects flows; every field that is set must match. It must name
// an address: OrigDst, ReplySrc or Addr, or OrigDstLocal with OrigDstPort
// (this node's own addresses on one port: a node port).
type Filter struct {
	// Protocol, when set, is the flow's L4 protocol.
	Protocol dataplane.Protocol
	// OrigDst is the original destination address (a VIP), and
	// OrigDstPort, when non-zero, its port.
	OrigDst     netip.Addr
	OrigDstPort uint16
	// OrigDstLocal selects flows whose original destination is one of this
	// node's own addresses (those of the network namespace, read when the
	// filter is applied): how a node port is reached. Without OrigDst it
	// needs OrigDstPort.
	OrigDstLocal bool
	// ReplySrc is the reply's source address: the endpoint a DNATed flow
	// was sent to. ReplySrcPort, when non-zero, is its port.
	ReplySrc     netip.Addr
	ReplySrcPort uint16
	// Untranslated selects flows that were not DNATed: the reply comes
	// from the original destination itself (address and port). Such an
	// entry to a Service address predates the rules that now translate it.
	Untranslated bool
	// Addr matches a flow that points at this address: its original
	// destination or its reply source is Addr (a pod, reached directly or
	// through a VIP).
	Addr netip.Addr
	// Family, 4 or 6, restricts the filter to one IP family; 0 means the
	// family of the addresses it names (both when it names none).
	Family int
}

// ErrEmptyFilter is returned for a Filter that names no address: it would
// match (and delete) unrelated flows.
var ErrEmptyFilter = errors.New("conntrack: a filter must name an address (refusing to flush unrelated entries)")

// Validate reports whether f is narrow enough to use.
func (f Filter) Validate() error {
	if !f.OrigDst.IsValid() && !f.ReplySrc.IsValid() && !f.Addr.IsValid() && !(f.OrigDstLocal && f.OrigDstPort != 0) {
		return ErrEmptyFilter
	}
	if f.OrigDstPort != 0 && !f.OrigDst.IsValid() && !f.OrigDstLocal || f.ReplySrcPort != 0 && !f.ReplySrc.IsValid() {
		return fmt.Errorf("conntrack: filter %s: a port needs its address", f)
	}
	switch f.Family {
	case 0, 4, 6:
	default:
		return fmt.Errorf("conntrack: filter %s: family %d, want 4 or 6", f, f.Family)
	}
	for _, a := range []netip.Addr{f.OrigDst, f.ReplySrc, f.Addr} {
		if a.IsValid() {
			if fam := familyOf(a); f.Family == 0 {
				f.Family = fam
			} else if fam != f.Family {
				return fmt.Errorf("conntrack: filter %s mixes IP families", f)
			}
		}
	}
	return nil
}

// family returns 4 or 6 when f is limited to one IP family, else 0.
func (f Filter) family() int {
	for _, a := range []netip.Addr{f.OrigDst, f.ReplySrc, f.Addr} {
		if a.IsValid() {
			return familyOf(a)
		}
	}
	return f.Family
}

func familyOf(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 4
	}
	return 6
}

// Local is the set of this node's own addresses (unmapped), against which
// OrigDstLocal is matched.
type Local map[netip.Addr]bool

// NewLocal returns the set of addrs.
func NewLocal(addrs ...netip.Addr) Local {
	l := make(Local, len(addrs))
	for _, a := range addrs {
		l[a.Unmap()] = true
	}
	return l
}

// needsLocal reports whether any filter needs the node's addresses.
func needsLocal(filters []Filter) bool {
	for _, f := range filters {
		if f.OrigDstLocal {
			return true
		}
	}
	return false
}

// Match reports whether fl is selected by f; local are this node's
// addresses (nil: none, so an OrigDstLocal filter matches nothing).
func (f Filter) Match(fl Flow, local Local) bool {
	if f.Validate() != nil {
		return false
	}
	if f.Protocol != "" && f.Protocol != fl.Protocol {
		return false
	}
	if fam := f.family(); fam != 0 && familyOf(fl.OrigDst.Addr()) != fam {
		return false
	}
	if f.OrigDst.IsValid() && fl.OrigDst.Addr().Unmap() != f.OrigDst.Unmap() {
		return false
	}
	if f.OrigDstPort != 0 && fl.OrigDst.Port() != f.OrigDstPort {
		return false
	}
	if f.OrigDstLocal && !local[fl.OrigDst.Addr().Unmap()] {
		return false
	}
	if f.ReplySrc.IsValid() && (fl.ReplySrc.Addr().Unmap() != f.ReplySrc.Unmap() || f.ReplySrcPort != 0 && fl.ReplySrc.Port() != f.ReplySrcPort) {
		return false
	}
	if f.Untranslated && (fl.ReplySrc.Addr().Unmap() != fl.OrigDst.Addr().Unmap() || fl.ReplySrc.Port() != fl.OrigDst.Port()) {
		return false
	}
	if f.Addr.IsValid() && fl.OrigDst.Addr().Unmap() != f.Addr.Unmap() && fl.ReplySrc.Addr().Unmap() != f.Addr.Unmap() {
		return false
	}
	return true
}

// String renders the filter in `conntrack -D` terms, for logs.
func (f Filter) String() string {
	var parts []string
	if f.Protocol != "" {
		parts = append(parts, "proto "+f.Protocol.Lower())
	}
	if f.Family != 0 {
		parts = append(parts, fmt.Sprintf("ipv%d", f.Family))
	}
	switch {
	case f.OrigDst.IsValid():
		parts = append(parts, "orig-dst "+addrPort(f.OrigDst, f.OrigDstPort))
	case f.OrigDstPort != 0:
		parts = append(parts, fmt.Sprintf("orig-port-dst %d", f.OrigDstPort))
	}
	if f.OrigDstLocal {
		parts = append(parts, "orig-dst local")
	}
	if f.ReplySrc.IsValid() {
		parts = append(parts, "reply-src "+addrPort(f.ReplySrc, f.ReplySrcPort))
	}
	if f.Untranslated {
		parts = append(parts, "untranslated")
	}
	if f.Addr.IsValid() {
		parts = append(parts, "orig-dst or reply-src "+f.Addr.String())
	}
	if len(parts) == 0 {
		return "(empty)"
	}
	return strings.Join(parts, " ")
}

func addrPort(a netip.Addr, port uint16) string {
	if port == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, port).String()
}

// Interface is what steelyard needs from the kernel's conntrack table.
type Interface interface {
	// List returns every flow of the table (IPv4 and IPv6).
	List() ([]Flow, error)
	// Delete deletes the flows that match any of filters and returns how
	// many it deleted. Every filter must be valid; an invalid one fails the
	// whole call before anything is deleted. OrigDstLocal is matched against
	// the node's addresses at the time of the call.
	Delete(filters ...Filter) (int, error)
}

func validate(filters []Filter) error {
	for _, f := range filters {
		if err := f.Validate(); err != nil {
			return err
		}
	}
	return nil
}
