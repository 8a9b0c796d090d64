package dataplane

import (
	"fmt"
	"time"
)

// Dataplane programs a desired State into the kernel of the network namespace
// it runs in, and reads the kernel back for the operator CLI.
//
// Sync is the only place that writes: the agent's sync loop calls it with the
// whole desired state, and the dataplane applies it atomically (one
// iptables-restore, one nft transaction, one IPVS difference). A failed Sync
// leaves the previously applied state in place.
//
// Each dataplane is constructed with everything it needs (its IP family,
// masquerade settings, where node addresses come from); callers never
// unwrap a concrete type. A dual-stack node runs one per family under
// DualStack.
type Dataplane interface {
	// Sync applies s. With req.Full, every object steelyard owns is
	// rewritten (which also repairs rules someone changed by hand);
	// otherwise only the Service ports of req.Changed are written. The
	// result tells whether the Sync was full (a dataplane goes full on its
	// own at its first Sync, after a failure, or when it finds its tables
	// flushed) and whether it wants another Sync soon.
	Sync(s State, req SyncRequest) (SyncResult, error)
	// Explain reads only the live kernel and returns what each VIP does.
	Explain() ([]ServiceView, error)
	// Counts reads the kernel's count of new connections per endpoint
	// (EndpointCount); none where counting is off (Config of each mode).
	Counts() ([]EndpointCount, error)
	// Cleanup removes everything steelyard created and nothing else.
	Cleanup() error
}

// ServiceName names a Service: its namespace and name.
type ServiceName struct {
	Namespace string
	Name      string
}

// String renders "namespace/name".
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Service returns the Service the port belongs to.
func (n ServicePortName) Service() ServiceName {
	return ServiceName{Namespace: n.Namespace, Name: n.Name}
}

// SyncRequest is what the agent asks of one Sync.
type SyncRequest struct {
	// Full asks for a full Sync: read the kernel back and rewrite whatever
	// differs from s.
	Full bool
	// Changed are the Services whose ports may differ from those of the
	// last successful Sync (came, changed or went): the set the Builder
	// computes from its cache (kube-proxy's UpdatedServices), so
	// dataplanes do not detect changes again. A partial Sync may look at
	// their ports only (and remove those that are gone); a port of a
	// Service not named is taken as unchanged. With Changed set, the
	// State is sorted (State.Sort), so a dataplane finds their ports with
	// State.PortsOf. Nil means unknown: every port may have changed (the
	// manifests source has no tracker). Ignored by full Syncs, which
	// check all.
	Changed map[ServiceName]bool
}

// FullSync is the request of a full Sync.
var FullSync = SyncRequest{Full: true}

// PartialSync is the request of a partial Sync with the changed Services
// unknown (every port is compared).
var PartialSync = SyncRequest{}

// MayHaveChanged reports whether a partial Sync must look at the port n:
// its Service is in Changed, or Changed is unknown. A full Sync looks at
// every port whatever this says.
func (r SyncRequest) MayHaveChanged(n ServicePortName) bool {
	return r.Full || r.Changed == nil || r.Changed[n.Service()]
}

// SyncResult is what a successful Sync did.
type SyncResult struct {
	// Full is true when the Sync was full: when asked, and when the
	// dataplane went full on its own. The agent then counts, logs and
	// times it as full and restarts its full-sync period.
	Full bool
	// RequeueAfter, when positive, asks for another Sync after that long
	// even if nothing changes (IPVS destinations that drain are deleted
	// soon after their last connection ends).
	RequeueAfter time.Duration
	// Written counts the Service ports the Sync wrote (updated or
	// removed), where the dataplane counts them.
	Written int
}

// Merge combines the results of two Syncs of one request (the two IP
// families): full if either was, the sooner requeue, the ports of both.
func (r SyncResult) Merge(o SyncResult) SyncResult {
	out := SyncResult{Full: r.Full || o.Full, RequeueAfter: r.RequeueAfter, Written: r.Written + o.Written}
	if o.RequeueAfter > 0 && (out.RequeueAfter <= 0 || o.RequeueAfter < out.RequeueAfter) {
		out.RequeueAfter = o.RequeueAfter
	}
	return out
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
