package nftables

import (
	"errors"
	"fmt"
	"time"

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

// Sync implements dataplane.Dataplane: one Sync per family (each Proxier
// keeps only the Service ports of its family).
func (d *DualStack) Sync(s dataplane.State, full bool) error {
	return d.SyncChanged(s, full, nil)
}

// SyncChanged is Sync with the change tracker's set of changed Service
// ports (see Proxier.SyncChanged).
func (d *DualStack) SyncChanged(s dataplane.State, full bool, changed map[dataplane.ServicePortName]bool) error {
	err4 := d.V4.SyncChanged(s, full, changed)
	if err4 != nil {
		err4 = fmt.Errorf("IPv4: %w", err4)
	}
	err6 := d.V6.SyncChanged(s, full, changed)
	if err6 != nil {
		err6 = fmt.Errorf("IPv6: %w", err6)
	}
	return errors.Join(err4, err6)
}

// PendingCleanup reports when either family has stale objects to delete.
func (d *DualStack) PendingCleanup() time.Duration {
	a, b := d.V4.PendingCleanup(), d.V6.PendingCleanup()
	if a == 0 || (b != 0 && b < a) {
		return b
	}
	return a
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
