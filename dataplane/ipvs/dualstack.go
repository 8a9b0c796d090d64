package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

// DualStack runs one Proxier per IP family over the shared IPVS table and
// steelyard0: the IPv4 one with iptables and the STEELYARD-IPVS-* sets,
// the IPv6 one with ip6tables and the STEELYARD-IPVS6-* sets (family
// inet6). Each family syncs on its own; a failure in one leaves the other
// applied and is returned.
type DualStack struct {
	V4 *Proxier
	// V6 is nil when the node cannot program IPv6 (no ip6tables, IPv6
	// off); IPv6 Service ports are then left out with a warning.
	V6 *Proxier
}

var _ dataplane.Dataplane = (*DualStack)(nil)

// NewDualStack returns a DualStack over the given kernel views; ipt6 nil
// means IPv4 only. cfg.Family is ignored.
func NewDualStack(k Interface, links Links, sets Sets, ipt4, ipt6 iptables.Interface, cfg Config) *DualStack {
	c4, c6 := cfg, cfg
	c4.Family, c6.Family = 4, 6
	d := &DualStack{V4: NewProxier(k, links, sets, ipt4, c4)}
	if ipt6 != nil {
		d.V6 = NewProxier(k, links, sets, ipt6, c6)
	}
	return d
}

// NewDualStackKernel returns a DualStack over the real kernel of the
// current network namespace. IPv6 is left out, with a log line, where
// ip6tables does not work (a kernel without IPv6).
func NewDualStackKernel(iptMode iptables.Mode, cfg Config) (*DualStack, error) {
	if iptMode == iptables.ModeAuto || iptMode == "" {
		// Both families use the flavour the host uses for IPv4.
		iptMode = iptables.Detect()
	}
	cfg.Family = 4
	v4, err := New(iptMode, cfg)
	if err != nil {
		return nil, err
	}
	d := &DualStack{V4: v4}
	ipt6, err := iptables.New6(iptMode)
	if err == nil {
		_, err = ipt6.SaveAll()
	}
	if err != nil {
		log.WithError(err).Info("ip6tables unusable: IPVS mode programs IPv4 only")
		return d, nil
	}
	c6 := cfg
	c6.Family = 6
	// The same kernel views: one IPVS table, one dummy interface.
	d.V6 = NewProxier(v4.ipvs.(familyIPVS).Interface, v4.links.(familyLinks).Links, v4.sets.(familySets).Sets, ipt6, c6)
	return d, nil
}

// Sync implements dataplane.Dataplane: one Sync per family.
func (d *DualStack) Sync(s dataplane.State, full bool) error {
	v4, v6 := iptables.SplitFamilies(s)
	err4 := d.V4.Sync(v4, full)
	if err4 != nil {
		err4 = fmt.Errorf("IPv4: %w", err4)
	}
	if d.V6 == nil {
		if len(v6.Services) > 0 {
			log.WithField("ports", len(v6.Services)).Warn("IPv6 Service ports left out: no usable ip6tables")
		}
		return err4
	}
	err6 := d.V6.Sync(v6, full)
	if err6 != nil {
		err6 = fmt.Errorf("IPv6: %w", err6)
	}
	return errors.Join(err4, err6)
}

// Explain implements dataplane.Dataplane: the views of both families.
func (d *DualStack) Explain() ([]dataplane.ServiceView, error) {
	if d.V6 == nil { // a nil *Proxier must not become a non-nil interface
		return dataplane.ExplainFamilies(d.V4, nil)
	}
	return dataplane.ExplainFamilies(d.V4, d.V6)
}

// Cleanup implements dataplane.Dataplane: both families' virtual servers,
// rules and sets, then the dummy interface.
func (d *DualStack) Cleanup() error {
	var err error
	if d.V6 != nil {
		err = d.V6.cleanup(false)
	}
	return errors.Join(err, d.V4.Cleanup())
}

// SetTrigger sets Config.Trigger of both families.
func (d *DualStack) SetTrigger(f func()) {
	d.V4.SetTrigger(f)
	if d.V6 != nil {
		d.V6.SetTrigger(f)
	}
}

// SetNodeAddresses sets Config.NodeAddresses of both families; each takes
// the addresses of its own.
func (d *DualStack) SetNodeAddresses(f func() []netip.Addr) {
	d.V4.SetNodeAddresses(f)
	if d.V6 != nil {
		d.V6.SetNodeAddresses(f)
	}
}

// Draining returns the destinations draining in either family, per VIP.
func (d *DualStack) Draining() map[dataplane.VIP][]netip.AddrPort {
	out := d.V4.Draining()
	if d.V6 != nil {
		for vip, ds := range d.V6.Draining() {
			out[vip] = ds
		}
	}
	return out
}
