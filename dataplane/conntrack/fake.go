package conntrack

import (
	"net/netip"
	"sync"
)

// Fake is an in-memory conntrack table for unit tests. It applies the same
// Filter matching as the real one and refuses invalid filters the same way.
type Fake struct {
	mu    sync.Mutex
	flows []Flow
	local Local
}

var _ Interface = (*Fake)(nil)

// NewFake returns a table holding flows.
func NewFake(flows ...Flow) *Fake {
	return &Fake{flows: append([]Flow(nil), flows...)}
}

// Add adds flows, as traffic would.
func (f *Fake) Add(flows ...Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append(f.flows, flows...)
}

// SetLocal sets the node's own addresses, which OrigDstLocal filters match.
func (f *Fake) SetLocal(addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.local = NewLocal(addrs...)
}

// List returns a copy of the table.
func (f *Fake) List() ([]Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Flow(nil), f.flows...), nil
}

// Delete removes the flows matching any filter.
func (f *Fake) Delete(filters ...Filter) (int, error) {
	if err := validate(filters); err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	kept := f.flows[:0]
	deleted := 0
	for _, fl := range f.flows {
		hit := false
		for _, flt := range filters {
			if flt.Match(fl, f.local) {
				hit = true
				break
			}
		}
		if hit {
			deleted++
			continue
		}
		kept = append(kept, fl)
	}
	f.flows = kept
	return deleted, nil
}
