package dataplane

import (
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"
)

var log = logrus.WithField("subsys", "dataplane")

// DualStack is the one dual-stack dataplane: it runs one per-family
// Dataplane for each IP family the node has (kube-proxy's metaproxier).
// Each family is a separate kernel ruleset (tables, sets, the IPVS virtual
// servers of that family), so each gets its own Sync with only the Service
// ports of its family; a failure in one leaves the other applied and is
// returned (the agent's next Sync is then full for both).
type DualStack struct {
	v4, v6 Dataplane
}

var _ Dataplane = (*DualStack)(nil)

// NewDualStack returns a DualStack over the IPv4 and IPv6 dataplanes; v6
// nil means the node programs IPv4 only (a kernel without IPv6), and IPv6
// Service ports are then left out with a warning.
func NewDualStack(v4, v6 Dataplane) *DualStack {
	return &DualStack{v4: v4, v6: v6}
}

// IPv6 reports whether the node programs IPv6 Service ports: the Builder
// builds them only then.
func (d *DualStack) IPv6() bool { return d.v6 != nil }

// Family returns the dataplane of family 4 or 6 (nil when absent), for
// tests and benchmarks that look inside one family.
func (d *DualStack) Family(family int) Dataplane {
	if family == 6 {
		return d.v6
	}
	return d.v4
}

// SplitFamilies returns the Service ports of s by family, in s's order. A
// State of one family comes back as it is, sharing s's array: the split
// runs on every sync, partial ones included, and copying 10,000 Service
// ports by append was 11.6 of the 14.6 MB one endpoint change allocated at
// 10,000 Services (BenchmarkEndpointChange10kx10 in dataplane/nftables),
// about 20 ms at 30,000 (BenchmarkChangeToMap in dataplane/ebpf). A mixed
// one is copied into two arrays of the right sizes.
func SplitFamilies(s State) (v4, v6 State) {
	n4 := 0
	for i := range s.Services {
		if s.Services[i].Family() == 4 {
			n4++
		}
	}
	switch n4 {
	case len(s.Services):
		return s, State{}
	case 0:
		return State{}, s
	}
	v4.Services = make([]ServicePort, 0, n4)
	v6.Services = make([]ServicePort, 0, len(s.Services)-n4)
	for i := range s.Services {
		if sp := &s.Services[i]; sp.Family() == 4 {
			v4.Services = append(v4.Services, *sp)
		} else {
			v6.Services = append(v6.Services, *sp)
		}
	}
	return v4, v6
}

// Sync implements Dataplane: one Sync per family, IPv4 first.
func (d *DualStack) Sync(s State, req SyncRequest) (SyncResult, error) {
	v4, v6 := SplitFamilies(s)
	res, err4 := d.v4.Sync(v4, req)
	if err4 != nil {
		err4 = fmt.Errorf("IPv4: %w", err4)
	}
	if d.v6 == nil {
		if len(v6.Services) > 0 {
			log.WithField("ports", len(v6.Services)).Warn("IPv6 Service ports left out: this node programs IPv4 only")
		}
		return res, err4
	}
	res6, err6 := d.v6.Sync(v6, req)
	if err6 != nil {
		err6 = fmt.Errorf("IPv6: %w", err6)
	}
	return res.Merge(res6), errors.Join(err4, err6)
}

// Explain implements Dataplane: the views of both families, sorted.
func (d *DualStack) Explain() ([]ServiceView, error) {
	if d.v6 == nil {
		return ExplainFamilies(d.v4, nil)
	}
	return ExplainFamilies(d.v4, d.v6)
}

// Counts implements Dataplane: the counts of both families.
func (d *DualStack) Counts() ([]EndpointCount, error) {
	c4, err := d.v4.Counts()
	if err != nil || d.v6 == nil {
		return MergeCounts(c4), err
	}
	c6, err := d.v6.Counts()
	if err != nil {
		return nil, fmt.Errorf("IPv6: %w", err)
	}
	return MergeCounts(c4, c6), nil
}

// Cleanup implements Dataplane: IPv6 first, then IPv4, whose dataplane
// also removes what the families share (the IPVS dummy interface).
func (d *DualStack) Cleanup() error {
	var err error
	if d.v6 != nil {
		if err = d.v6.Cleanup(); err != nil {
			err = fmt.Errorf("IPv6: %w", err)
		}
	}
	return errors.Join(err, d.v4.Cleanup())
}
