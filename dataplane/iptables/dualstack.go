package iptables

import (
	"errors"
	"fmt"

	"github.com/steelyard-net/steelyard/dataplane"
)

// DualStack drives one Proxier per IP family: the IPv4 one writes with
// iptables-restore, the IPv6 one with ip6tables-restore. Each family is a
// separate kernel ruleset, so each gets its own atomic sync; a failure in
// one leaves the other applied and is returned.
type DualStack struct {
	V4 *Proxier
	// V6 is nil when the node has no usable IPv6 tables; IPv6 Service ports
	// are then left out (and logged once per sync).
	V6 *Proxier
}

var _ dataplane.Dataplane = (*DualStack)(nil)

// NewDualStack returns a DualStack over ipt4 and ipt6 (nil: IPv4 only),
// with cfg for both (each takes the addresses of its own family).
func NewDualStack(ipt4, ipt6 Interface, cfg Config) *DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	d := &DualStack{V4: NewProxier(ipt4, c4)}
	if ipt6 != nil {
		d.V6 = NewProxier(ipt6, c6)
	}
	return d
}

// SplitFamilies returns the Service ports of s by family.
func SplitFamilies(s dataplane.State) (v4, v6 dataplane.State) {
	for _, sp := range s.Services {
		if sp.Family() == 4 {
			v4.Services = append(v4.Services, sp)
		} else {
			v6.Services = append(v6.Services, sp)
		}
	}
	return v4, v6
}

// Sync implements dataplane.Dataplane: one sync per family.
func (d *DualStack) Sync(s dataplane.State, full bool) error {
	v4, v6 := SplitFamilies(s)
	err4 := d.V4.Sync(v4, full)
	if err4 != nil {
		err4 = fmt.Errorf("IPv4: %w", err4)
	}
	if d.V6 == nil {
		if len(v6.Services) > 0 {
			log.WithField("services", len(v6.Services)).Warn("IPv6 Service ports left out: no usable ip6tables")
		}
		return err4
	}
	err6 := d.V6.Sync(v6, full)
	if err6 != nil {
		err6 = fmt.Errorf("IPv6: %w", err6)
	}
	return errors.Join(err4, err6)
}

// LastSyncFull reports whether the last successful Sync of either family
// was full, asked for or not (see Proxier.LastSyncFull).
func (d *DualStack) LastSyncFull() bool {
	return d.V4.LastSyncFull() || d.V6 != nil && d.V6.LastSyncFull()
}

// Explain implements dataplane.Dataplane: the views of both families.
func (d *DualStack) Explain() ([]dataplane.ServiceView, error) {
	if d.V6 == nil { // a nil *Proxier must not become a non-nil interface
		return dataplane.ExplainFamilies(d.V4, nil)
	}
	return dataplane.ExplainFamilies(d.V4, d.V6)
}

// Cleanup implements dataplane.Dataplane for both families.
func (d *DualStack) Cleanup() error {
	err := d.V4.Cleanup()
	if d.V6 != nil {
		err = errors.Join(err, d.V6.Cleanup())
	}
	return err
}
