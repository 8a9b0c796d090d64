package ipvs

import (
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/internal/iptables"
)

// NewDualStack returns the dual-stack IPVS dataplane over the given kernel
// views: one Proxier per family over the shared IPVS table and steelyard0,
// the IPv4 one with iptables and the STEELYARD-IPVS-* sets, the IPv6 one
// with ip6tables and the STEELYARD-IPVS6-* sets (family inet6). ipt6 nil
// means IPv4 only. cfg.Family is ignored.
func NewDualStack(k Interface, links Links, sets Sets, ipt4, ipt6 iptables.Interface, cfg Config) *dataplane.DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	v4 := NewProxier(k, links, sets, ipt4, c4)
	if ipt6 == nil {
		return dataplane.NewDualStack(v4, nil)
	}
	return dataplane.NewDualStack(v4, NewProxier(k, links, sets, ipt6, c6))
}

// NewDualStackKernel returns the dual-stack IPVS dataplane over the real
// kernel of the current network namespace. IPv6 is left out, with a log
// line, where ip6tables does not work (a kernel without IPv6).
func NewDualStackKernel(iptMode iptables.Mode, cfg Config) (*dataplane.DualStack, error) {
	if iptMode == iptables.ModeAuto || iptMode == "" {
		// Both families use the flavour the host uses for IPv4.
		iptMode = iptables.Detect()
	}
	cfg.Family = 4
	v4, err := New(iptMode, cfg)
	if err != nil {
		return nil, err
	}
	ipt6, err := iptables.New6(iptMode)
	if err == nil {
		_, err = ipt6.SaveAll()
	}
	if err != nil {
		log.WithError(err).Info("ip6tables unusable: IPVS mode programs IPv4 only")
		return dataplane.NewDualStack(v4, nil), nil
	}
	c6 := cfg
	c6.Family = 6
	// The same kernel views: one IPVS table, one dummy interface.
	v6 := NewProxier(v4.ipvs.(familyIPVS).Interface, v4.links.(familyLinks).Links, v4.sets.(familySets).Sets, ipt6, c6)
	return dataplane.NewDualStack(v4, v6), nil
}
