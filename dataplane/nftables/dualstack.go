package nftables

import (
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// NewDualStack returns the dual-stack nftables dataplane: a Proxier for
// "ip steelyard" (IPv4 VIPs) over nft4 and one for "ip6 steelyard" over
// nft6 (each bound to its family and TableName), with cfg for both.
func NewDualStack(nft4, nft6 knftables.Interface, cfg Config) *dataplane.DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	return dataplane.NewDualStack(NewProxier(nft4, c4), NewProxier(nft6, c6))
}

// NewDualStackKernel returns the dual-stack nftables dataplane over the nft
// binary.
func NewDualStackKernel(cfg Config) (*dataplane.DualStack, error) {
	v4, v6, err := newKernelPair(cfg)
	if err != nil {
		return nil, err
	}
	return dataplane.NewDualStack(v4, v6), nil
}

// newKernelPair returns the IPv4 and IPv6 Proxiers over the nft binary.
func newKernelPair(cfg Config) (*Proxier, *Proxier, error) {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	v4, err := NewKernel(c4)
	if err != nil {
		return nil, nil, err
	}
	v6, err := NewKernel(c6)
	if err != nil {
		return nil, nil, fmt.Errorf("IPv6: %w", err)
	}
	// One namespace, one generation counter: each family's commits are
	// explained, not foreign, to the other's full resync.
	v6.gen = v4.gen
	return v4, v6, nil
}
