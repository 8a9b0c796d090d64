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
// Deletions are always narrow: a Filter must name an address, and an empty
// Filter is refused, so nothing here can flush the table (live UDP flows
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

// Filter selects flows; every field that is set must match. At least one of
// OrigDst, ReplySrc and Addr must be set.
type Filter struct {
	// Protocol, when set, is the flow's L4 protocol.
	Protocol dataplane.Protocol
	// OrigDst is the original destination address (a VIP), and
	// OrigDstPort, when non-zero, its port.
	OrigDst     netip.Addr
	OrigDstPort uint16
	// ReplySrc is the reply's source address: the endpoint a DNATed flow
	// was sent to. ReplySrcPort, when non-zero, is its port.
	ReplySrc     netip.Addr
	ReplySrcPort uint16
	// Addr matches a flow that points at this address: its original
	// destination or its reply source is Addr (a pod, reached directly or
	// through a VIP).
	Addr netip.Addr
}

// ErrEmptyFilter is returned for a Filter that names no address: it would
// match (and delete) unrelated flows.
var ErrEmptyFilter = errors.New("conntrack: a filter must name an address (refusing to flush unrelated entries)")

// Validate reports whether f is narrow enough to use.
func (f Filter) Validate() error {
	if !f.OrigDst.IsValid() && !f.ReplySrc.IsValid() && !f.Addr.IsValid() {
		return ErrEmptyFilter
	}
	if f.OrigDstPort != 0 && !f.OrigDst.IsValid() || f.ReplySrcPort != 0 && !f.ReplySrc.IsValid() {
		return fmt.Errorf("conntrack: filter %s: a port needs its address", f)
	}
	return nil
}

// Match reports whether fl is selected by f.
func (f Filter) Match(fl Flow) bool {
	if f.Validate() != nil {
		return false
	}
	if f.Protocol != "" && f.Protocol != fl.Protocol {
		return false
	}
	if f.OrigDst.IsValid() && (fl.OrigDst.Addr().Unmap() != f.OrigDst.Unmap() || f.OrigDstPort != 0 && fl.OrigDst.Port() != f.OrigDstPort) {
		return false
	}
	if f.ReplySrc.IsValid() && (fl.ReplySrc.Addr().Unmap() != f.ReplySrc.Unmap() || f.ReplySrcPort != 0 && fl.ReplySrc.Port() != f.ReplySrcPort) {
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
	if f.OrigDst.IsValid() {
		parts = append(parts, "orig-dst "+addrPort(f.OrigDst, f.OrigDstPort))
	}
	if f.ReplySrc.IsValid() {
		parts = append(parts, "reply-src "+addrPort(f.ReplySrc, f.ReplySrcPort))
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
	// whole call before anything is deleted.
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
