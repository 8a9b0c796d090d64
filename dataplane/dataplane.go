package dataplane

import "fmt"

// Dataplane programs a desired State into the kernel of the network namespace
// it runs in, and reads the kernel back for the operator CLI.
//
// Sync is the only place that writes: the agent's sync loop calls it with the
// whole desired state, and the dataplane applies it atomically (one
// iptables-restore, one nft transaction, one IPVS difference). A failed Sync
// leaves the previously applied state in place.
type Dataplane interface {
	// Sync applies s. With full, every object steelyard owns is rewritten
	// (which also repairs rules someone changed by hand); otherwise only what
	// changed since the last successful Sync is written.
	Sync(s State, full bool) error
	// Explain reads only the live kernel and returns what each VIP does.
	Explain() ([]ServiceView, error)
	// Cleanup removes everything steelyard created and nothing else.
	Cleanup() error
}

// Explainer is the read side of a Dataplane: one IP family's proxier.
type Explainer interface {
	Explain() ([]ServiceView, error)
}

// ExplainFamilies merges the views of the IPv4 and IPv6 halves of a
// dual-stack dataplane, sorted; v6 may be nil (IPv4 only).
func ExplainFamilies(v4, v6 Explainer) ([]ServiceView, error) {
	views, err := v4.Explain()
	if err != nil || v6 == nil {
		return views, err
	}
	more, err := v6.Explain()
	if err != nil {
		return nil, fmt.Errorf("IPv6: %w", err)
	}
	views = append(views, more...)
	SortViews(views)
	return views, nil
}
