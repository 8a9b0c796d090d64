package dataplane

import (
	"fmt"
	"net/netip"
)

// DefaultMasqueradeBit is the fwmark bit that asks for masquerading when
// Masquerade leaves it zero: 13 (0x2000), away from kube-proxy's 14 and 15.
const DefaultMasqueradeBit = 13

// Masquerade says which new connections to a VIP are masqueraded, the same
// in every dataplane: those from outside the cluster CIDRs (so replies come
// back through this node), hairpin ones, or all of them.
type Masquerade struct {
	// ClusterCIDRs are the pod ranges. New connections to a VIP from
	// outside them are masqueraded; prefixes of the other family are
	// ignored by each family's dataplane.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades every new connection to a VIP.
	MasqueradeAll bool
	// MasqueradeBit is the fwmark bit that marks a packet for masquerading;
	// 0 means DefaultMasqueradeBit.
	MasqueradeBit int
}

// ParseMasquerade checks the masquerade flags (--cluster-cidr,
// --masquerade-all, --masquerade-bit) and returns their Masquerade.
func ParseMasquerade(clusterCIDRs []string, all bool, bit int) (Masquerade, error) {
	if bit < 0 || bit > 31 {
		return Masquerade{}, fmt.Errorf("--masquerade-bit %d: want 0 to 31", bit)
	}
	m := Masquerade{MasqueradeAll: all, MasqueradeBit: bit}
	for _, c := range clusterCIDRs {
		if c == "" {
			continue // an empty value from a ConfigMap: none
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return Masquerade{}, fmt.Errorf("--cluster-cidr %q: %w", c, err)
		}
		m.ClusterCIDRs = append(m.ClusterCIDRs, p.Masked())
	}
	return m, nil
}

// Bit returns the fwmark bit in use.
func (m Masquerade) Bit() int {
	if m.MasqueradeBit == 0 {
		return DefaultMasqueradeBit
	}
	return m.MasqueradeBit
}

// Mark returns the fwmark value of the bit ("0x2000" for bit 13), as
// iptables and nft spell it.
func (m Masquerade) Mark() string { return fmt.Sprintf("0x%x", uint32(1)<<m.Bit()) }

// CIDRs returns the cluster CIDRs of one family (4 or 6).
func (m Masquerade) CIDRs(family int) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range m.ClusterCIDRs {
		if p.Addr().Is4() == (family == 4) {
			out = append(out, p)
		}
	}
	return out
}
