package nftables

import (
	"errors"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// DualStack runs one Proxier per family: "ip steelyard" for IPv4 VIPs and
// "ip6 steelyard" for IPv6 ones.
type DualStack struct {
	V4, V6 *Proxier
}

var _ dataplane.Dataplane = (*DualStack)(nil)

// NewDualStack returns a DualStack over nft4 and nft6 (each bound to its
// family and TableName), with cfg for both.
func NewDualStack(nft4, nft6 knftables.Interface, cfg Config) *DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	return &DualStack{V4: NewProxier(nft4, c4), V6: NewProxier(nft6, c6)}
}

// NewDualStackKernel returns a DualStack over the nft binary.
func NewDualStackKernel(cfg Config) (*DualStack, error) {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	v4, err := NewKernel(c4)
	if err != nil {
		return nil, err
	}
	v6, err := NewKernel(c6)
	if err != nil {
		return nil, fmt.Errorf("IPv6: %w", err)
	}
	return &DualStack{V4: v4, V6: v6}, nil
}

// Sync implements dataplane.Dataplane: one transaction per family (each
// Proxier keeps only the Service ports of its family).
func (d *DualStack) Sync(s dataplane.State, full bool) error {
	err4 := d.V4.Sync(s, full)
	if err4 != nil {
		err4 = fmt.Errorf("IPv4: %w", err4)
	}
	err6 := d.V6.Sync(s, full)
	if err6 != nil {
		err6 = fmt.Errorf("IPv6: %w", err6)
	}
	return errors.Join(err4, err6)
}

// LastSyncFull reports whether the last successful Sync of either family
// was full.
func (d *DualStack) LastSyncFull() bool { return d.V4.LastSyncFull() || d.V6.LastSyncFull() }

// Explain implements dataplane.Dataplane: the views of both tables.
func (d *DualStack) Explain() ([]dataplane.ServiceView, error) {
	return dataplane.ExplainFamilies(d.V4, d.V6)
}

// Cleanup implements dataplane.Dataplane: both tables are deleted.
func (d *DualStack) Cleanup() error {
	return errors.Join(d.V4.Cleanup(), d.V6.Cleanup())
}
