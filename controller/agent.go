package controller

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/steelyard-net/steelyard/dataplane"
)

var agentLog = logrus.WithField("subsys", "agent")

// Snapshot is a source that returns every Service and EndpointSlice it
// knows, plus errors about input it could not read (reported, not fatal).
type Snapshot interface {
	Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error)
}

// Agent is the sync loop's body: source -> Builder -> one Dataplane.Sync.
// It is the only caller of Dataplane.Sync, so every kernel write happens
// here, one at a time.
type Agent struct {
	Source Snapshot
	// Tracker, when the source has one, is drained at the start of each
	// sync: events after that point trigger the next sync. Between full
	// syncs its changes are all the Builder sees (Builder.Update), so it
	// must see every event of the Source's objects.
	Tracker   *ChangeTracker
	Builder   *Builder
	Dataplane dataplane.Dataplane
	// FullSyncPeriod is how often a sync is full: it reads the kernel back
	// and rewrites whatever differs (repairing hand edits). Syncs in
	// between, the periodic ones included, write only what changed (the
	// dataplane still goes full on its own when it finds its tables
	// flushed). Full syncs are rare because at scale one costs seconds
	// and every change waits behind it. Zero: every sync is full.
	FullSyncPeriod time.Duration
	Clock          clock.Clock
	// Events, when set, receives a Warning Event on the Service for each
	// new problem (reason InvalidWeights for annotations). The recorder's
	// own spam filter rate-limits repeats.
	Events record.EventRecorder
	// Metrics and Health, when set, are updated after each sync.
	Metrics *Metrics
	Health  *Health
	// Zone, when set, is read into Builder.Zone at the start of each sync:
	// the node's zone as its Node object says now (NodeWatcher).
	Zone func() string
	// Conntrack, when set, deletes the UDP conntrack entries that a sync
	// leaves pointing at endpoints that left (see StaleFlows); nil: off.
	Conntrack ConntrackCleaner
	// Requeue, when set, asks for a sync (the runner's Trigger). The agent
	// calls it once a sync's RequeueAfter has passed (IPVS destinations
	// draining), so no dataplane needs to know the runner.
	Requeue func()
	// Routes, when set, gives the Gateway API splits of each sync (see
	// Routes); it sees the same Services as the Builder.
	Routes RouteSource

	lastFull      time.Time
	retryTriggers []time.Time
	// loaded is set once the Builder holds the source's objects (a Load):
	// from then on the tracker's changes keep it current (Update).
	loaded   bool
	problems map[string]bool
	inputs   map[string]bool
	// applied is the last State a Sync applied (for Conntrack), nil
	// before the first successful sync.
	applied *dataplane.State
	// conntrackRetry: the last deletion failed, the next compares every
	// UDP port with applied.
	conntrackRetry bool
	// requeue is the pending Requeue call, if any (under requeueMu: it
	// fires on its own goroutine).
	requeueMu sync.Mutex
	requeue   bool
	// lastRouted are the Services whose ports routes made at the last
	// successful sync (so a partial sync also removes a route's ports).
	lastRouted map[dataplane.ServiceName]bool
	// nodeChanged is set by NodeChanged (from the Node watch's goroutine).
	nodeChanged atomic.Bool
	// last is the State of the last successful sync and lastBad its
	// problem count, reused while nothing changes (see unchanged).
	last    *dataplane.State
	lastBad int
	// endpoints counts the programmed endpoints (a metric).
	endpoints endpointCount
}

// endpointCount counts the endpoints with a positive weight, per Service
// and in total, so a partial sync recounts only the Services it changed:
// counting all of them walked 100,000 Backends per change at 10,000
// Services x 10, a quarter of the agent's CPU for one endpoint change
// (BenchmarkEndpointChange10kx10).
type endpointCount struct {
	bySvc map[dataplane.ServiceName]int
	total int
}

// update recounts the Services of changed in s (nil: every Service) and
// returns the total.
func (c *endpointCount) update(s dataplane.State, changed map[dataplane.ServiceName]bool) int {
	if changed == nil || c.bySvc == nil {
		c.bySvc = make(map[dataplane.ServiceName]int, len(c.bySvc))
		c.total = 0
		for i := range s.Services {
			n := s.Services[i].Name.Service()
			k := activeCount(&s.Services[i])
			c.bySvc[n] += k
			c.total += k
		}
		return c.total
	}
	for n := range changed {
		k := 0
		ports := s.PortsOf(n)
		for i := range ports {
			k += activeCount(&ports[i])
		}
		c.total += k - c.bySvc[n]
		if k == 0 {
			delete(c.bySvc, n)
		} else {
			c.bySvc[n] = k
		}
	}
	return c.total
}

// activeCount counts sp's endpoints with a positive weight, in place
// (Active copies and sorts).
func activeCount(sp *dataplane.ServicePort) int {
	k := 0
	for i := range sp.Backends {
		if sp.Backends[i].Weight > 0 {
			k++
		}
	}
	return k
}

// NodeChanged tells the agent that the node's addresses or zone changed, so
// the next sync looks at every Service port (node ports and topology
// depend on them, not only on the Services the tracker saw change).
func (a *Agent) NodeChanged() { a.nodeChanged.Store(true) }

// RouteSource gives the routes of one sync from the Services it reads
// (controller/gateway implements it).
type RouteSource interface {
	Routes(svcs []*corev1.Service) Routes
}

// ErrSync marks a sync that failed in the dataplane.
var ErrSync = errors.New("sync failed")

// Sync reads the source, builds the desired state and applies it.
func (a *Agent) Sync() error {
	clk := a.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	start := clk.Now()
	changed := -1
	var drained Drained
	// A source that can hold its caches still (ClusterSource) does so from
	// the Drain to the end of Load: the snapshot built is then exactly the
	// one the tracker compares the next events with.
	locker, _ := a.Source.(sync.Locker)
	if locker != nil && a.Tracker != nil {
		locker.Lock()
	} else {
		locker = nil
	}
	unlock := func() {
		if locker != nil {
			locker.Unlock()
			locker = nil
		}
	}
	defer unlock()
	if a.Tracker != nil {
		drained = a.Tracker.Drain()
		changed = len(drained.Services)
		drained.Triggers = append(drained.Triggers, a.retryTriggers...)
		a.retryTriggers = nil
	}
	// A new zone or node address can change every Service's ports, which
	// the Service tracker does not see: that sync compares every port.
	nodeChanged := a.nodeChanged.Swap(false)
	if a.Zone != nil {
		if z := a.Zone(); z != a.Builder.Zone {
			a.Builder.Zone = z
			nodeChanged = true
		}
	}
	full := a.lastFull.IsZero() || clk.Since(a.lastFull) >= a.FullSyncPeriod
	var (
		state   dataplane.State
		routed  map[dataplane.ServiceName]bool
		changes map[dataplane.ServiceName]bool
		bad     int
	)
	if a.unchanged(drained, nodeChanged, full) {
		// Nothing the Builder reads changed since the last successful
		// sync (a periodic sync, a dataplane's requeue): the desired
		// state is that sync's. Building 10,000 Services x 10 endpoints
		// again costs about 0.2 CPU-s and 92 MB of garbage
		// (BenchmarkBuild10kx10), which made such a sync take 0.5-1.6 s
		// in bench-k8s; now it costs what the dataplane's check does.
		unlock()
		state, bad = *a.last, a.lastBad
		changes = map[dataplane.ServiceName]bool{}
	} else {
		// A Build makes a new State: let the last one go first, or both
		// are live at once (the agent's peak of memory was the Build of
		// a partial sync). A failed sync leaves it nil: the next is full.
		a.last = nil
		// A full sync, the first and a node change list every object
		// and build every Service (the repair path); other syncs fold
		// the tracker's changes into the Builder, which rebuilds only
		// the Services they touch and says which ones changed.
		rebuild := a.Tracker == nil || !a.loaded || full || nodeChanged
		if rebuild {
			// Build reads the source, not the drained objects: let them
			// go (the first sync drains every object, 2.9 MiB at 10,000
			// Services x 10 live through the sync, BenchmarkMemorySeeded10kx10).
			drained.Objects, drained.Services = nil, nil
		}
		state, routed, changes, bad = a.build(drained, rebuild, unlock)
	}
	built := clk.Now()
	req := dataplane.SyncRequest{Full: full}
	if a.Tracker != nil && changes != nil && !nodeChanged {
		req.Changed = changes
		// A route's listener ports are built on every sync: the few
		// ports that routes make (now or at the last sync) are always
		// looked at.
		for n := range routed {
			req.Changed[n] = true
		}
		for n := range a.lastRouted {
			req.Changed[n] = true
		}
	}
	res, err := a.Dataplane.Sync(state, req)
	if err != nil {
		// The dataplane kept its previous state; the runner retries and the
		// next attempt is a full sync.
		a.lastFull = time.Time{}
		// Those endpoint changes are still to be programmed: count their
		// latency when a sync finally succeeds.
		a.retryTriggers = drained.Triggers
		if a.Metrics != nil {
			a.Metrics.SyncFailures.Inc()
		}
		agentLog.WithError(err).Error("sync failed")
		return errors.Join(ErrSync, err)
	}
	if res.Full {
		full = true // the dataplane went full on its own (tables flushed)
	}
	if full {
		a.lastFull = start
	}
	a.lastRouted = routed
	a.last, a.lastBad = &state, bad
	a.scheduleRequeue(clk, res.RequeueAfter)
	a.cleanConntrack(state, req.Changed)
	if n, ok := a.Routes.(ProgrammedNotifier); ok {
		n.Programmed()
	}
	a.observe(state, drained, full, start, bad, req.Changed)
	fields := logrus.Fields{"full": full, "services": len(state.Services), "took": clk.Since(start).Round(time.Microsecond).String(),
		// Where a sync's time goes: reading the caches and building the
		// desired state, then the dataplane (and what follows it).
		"build": built.Sub(start).Round(time.Microsecond).String()}
	if changed >= 0 {
		fields["changed"] = changed
	}
	if res.Written > 0 {
		// Service ports the dataplane wrote (its reconcile engine's count).
		fields["written"] = res.Written
	}
	if oldest, ok := oldestTrigger(drained.Triggers); ok {
		// From the oldest endpoint change this sync programs (its
		// last-change-trigger-time) to the sync's start: the API server,
		// the watch, the tracker and the runner's wait together.
		fields["queued"] = start.Sub(oldest).Round(time.Microsecond).String()
	}
	agentLog.WithFields(fields).Info("synced")
	return nil
}

// oldestTrigger returns the earliest of ts.
func oldestTrigger(ts []time.Time) (time.Time, bool) {
	if len(ts) == 0 {
		return time.Time{}, false
	}
	oldest := ts[0]
	for _, t := range ts[1:] {
		if t.Before(oldest) {
			oldest = t
		}
	}
	return oldest, true
}

// build gives the desired state: with rebuild, from every object of the
// source (Build); otherwise from the drained changes (Update), with the
// Services whose ports changed (nil: unknown, every port may differ). bad
// counts the problems and input errors (the InvalidAnnotations gauge).
func (a *Agent) build(drained Drained, rebuild bool, loaded func()) (state dataplane.State, routed map[dataplane.ServiceName]bool, changed map[dataplane.ServiceName]bool, bad int) {
	var svcs []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	inputErrs := len(a.inputs)
	if rebuild {
		var errs []error
		svcs, slices, errs = a.Source.Load()
		a.inputs = reportChanges(a.inputs, errorStrings(errs), "input error", "input error resolved")
		inputErrs = len(errs)
		// The objects drained at the start of this sync are in the list;
		// changes after it reach the next sync through the tracker.
		a.loaded = true
	}
	// The source's caches may move again (Update works from the drained
	// objects, not from the caches).
	loaded()
	if a.Routes != nil {
		if !rebuild {
			svcs = a.Builder.Services()
		}
		routes := a.Routes.Routes(svcs)
		a.Builder.SetRoutes(routes)
		routed = routes.serviceNames()
	}
	var problems []Problem
	if rebuild {
		state, problems = a.Builder.Build(svcs, slices)
	} else {
		state, problems, changed = a.Builder.Update(drained.Objects)
	}
	ps := make([]string, 0, len(problems))
	for _, p := range problems {
		ps = append(ps, p.Error())
	}
	prev := a.problems
	a.problems = reportChanges(a.problems, ps, "bad input: this object keeps its last valid values; other Services are unaffected", "bad input fixed")
	if a.Events != nil {
		for _, p := range problems {
			if !prev[p.Error()] {
				a.recordEvent(p)
			}
		}
	}
	return state, routed, changed, len(problems) + inputErrs
}

// unchanged reports whether a sync may reuse the last successful sync's
// state: a partial sync with a tracker that saw no change, no node change
// and no route source (routes change without the tracker), after a sync
// that succeeded (a failure makes the next sync full).
func (a *Agent) unchanged(drained Drained, nodeChanged, full bool) bool {
	return a.last != nil && !full && a.Tracker != nil && a.Routes == nil && !nodeChanged &&
		len(drained.Services) == 0 && len(drained.Triggers) == 0 && len(drained.Objects) == 0
}

// scheduleRequeue calls Requeue after d (when positive), once: a pending
// call is kept.
func (a *Agent) scheduleRequeue(clk clock.Clock, d time.Duration) {
	if a.Requeue == nil || d <= 0 {
		return
	}
	a.requeueMu.Lock()
	defer a.requeueMu.Unlock()
	if a.requeue {
		return
	}
	a.requeue = true
	fire := func() {
		a.requeueMu.Lock()
		a.requeue = false
		a.requeueMu.Unlock()
		a.Requeue()
	}
	if dc, ok := clk.(clock.WithDelayedExecution); ok {
		dc.AfterFunc(d, fire)
	} else {
		time.AfterFunc(d, fire)
	}
}

func errorStrings(errs []error) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// reportChanges logs messages that are new since the last sync (warning)
// and those that went away (info), so a standing problem is not logged on
// every sync.
func reportChanges(prev map[string]bool, cur []string, newMsg, goneMsg string) map[string]bool {
	next := make(map[string]bool, len(cur))
	for _, m := range cur {
		next[m] = true
		if !prev[m] {
			agentLog.WithField("problem", m).Warn(newMsg)
		}
	}
	for m := range prev {
		if !next[m] {
			agentLog.WithField("problem", m).Info(goneMsg)
		}
	}
	return next
}

// observe updates metrics and health after a successful sync.
// changed names the Services whose ports may differ from the last sync's
// (nil: any of them).
func (a *Agent) observe(state dataplane.State, drained Drained, full bool, start time.Time, bad int, changed map[dataplane.ServiceName]bool) {
	clk := a.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	if a.Health != nil {
		a.Health.Synced()
	}
	m := a.Metrics
	if m == nil {
		return
	}
	now := clk.Now()
	took := now.Sub(start).Seconds()
	m.SyncDuration.Observe(took)
	if full {
		m.FullSyncDuration.Observe(took)
	} else {
		m.PartialSyncDuration.Observe(took)
	}
	for _, t := range drained.Triggers {
		m.NetworkProgramming.Observe(now.Sub(t).Seconds())
	}
	m.LastSyncTimestamp.Set(float64(now.UnixNano()) / 1e9)
	m.ProgrammedServices.Set(float64(len(state.Services)))
	m.ProgrammedEndpoints.Set(float64(a.endpoints.update(state, changed)))
	m.InvalidAnnotations.Set(float64(bad))
	if m.endpoints != nil {
		m.endpoints.setState(state)
	}
}

// Event reasons.
const (
	ReasonInvalidWeights = "InvalidWeights"
	ReasonInvalidService = "InvalidService"
	// ReasonRouteWins: a TCPRoute/UDPRoute with the Service as parent
	// overrides its AnnotationSplit.
	ReasonRouteWins = "RouteWinsOverSplit"
)

func (a *Agent) recordEvent(p Problem) {
	reason := ReasonInvalidService
	switch {
	case errors.Is(p.Err, ErrRouteWins):
		reason = ReasonRouteWins
	case p.Annotation != "":
		reason = ReasonInvalidWeights
	}
	ref := &corev1.ObjectReference{Kind: "Service", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name}
	if svc := a.Builder.Service(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}); svc != nil {
		ref.UID, ref.ResourceVersion = svc.UID, svc.ResourceVersion
	}
	a.Events.Event(ref, corev1.EventTypeWarning, reason, p.Error())
}
