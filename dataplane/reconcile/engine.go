// Package reconcile is the engine a dataplane's Sync runs on (issue 21,
// item 3): it owns the decisions every dataplane made on its own before,
// in one place, and leaves each dataplane only the operations on its own
// kernel objects.
//
// The engine decides whether a Sync is full or partial, finds the Service
// ports to write (those of the changed Services whose desired port differs
// from the one recorded, those the record has and the state lost, and
// those not written yet because an earlier write failed), orders them
// (removals first), hands them to the dataplane's Ops in batches that are
// each one kernel write, asks for a prune after full Syncs, and keeps the
// record of what the kernel holds together with a status per Service port
// (pending, done, failed). The shape follows Cilium's statedb reconciler
// (operations Update, Delete and Prune registered with one reconciler
// that owns retries and status), fitted to steelyard's agent: the agent's
// runner still schedules the retry of a failed Sync (its retry interval
// is the backoff), and the engine makes that retry full.
package reconcile

import (
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

var log = logrus.WithField("subsys", "reconcile")

// Status is where one Service port stands.
type Status uint8

// The statuses of a Service port.
const (
	// Unknown: the engine neither wrote the port nor has it to write.
	Unknown Status = iota
	// Pending: to be written (changed, or in a batch that was not
	// committed because an earlier one failed).
	Pending
	// Done: the kernel holds what the record says.
	Done
	// Failed: its batch was refused; the record keeps the port's previous
	// value (what the kernel still holds).
	Failed
)

// String names the status.
func (s Status) String() string {
	return [...]string{"unknown", "pending", "done", "failed"}[s]
}

// Plan is what a dataplane says about one Sync once it knows whether the
// Sync is full (Ops.Begin).
type Plan struct {
	// Batch, when positive, splits the writes into kernel writes of at
	// most that many Service ports (each one atomic); zero: one write.
	Batch int
	// Rewrite names recorded Service ports to write again although their
	// desired value did not change: a full Sync found their objects
	// missing from the kernel. Ports the state no longer has are ignored
	// (they are removed anyway).
	Rewrite []dataplane.ServicePortName
}

// Ops are one dataplane's operations over its Service ports. The engine
// calls them in this order within a Sync: Intact (partial Syncs only),
// Begin, then Update or Delete per port with a Commit after each batch,
// Prune (full Syncs only) before the last Commit, and Done once
// everything committed. A failed Begin or Commit ends the Sync, and the
// next one is full.
type Ops interface {
	// Wants reports whether the dataplane programs sp (its IP family,
	// what its objects serve).
	Wants(sp *dataplane.ServicePort) bool
	// Intact reports whether the kernel still holds the dataplane's
	// objects (its table was not flushed): false makes the Sync full.
	// It logs why it says false.
	Intact() bool
	// Begin starts a Sync. applied is the record (read only).
	Begin(full bool, applied map[dataplane.ServicePortName]*dataplane.ServicePort) (Plan, error)
	// Update adds the writes that turn port n from old (nil: new) into
	// sp to the current batch, and returns the value to record for n
	// (sp, or a copy the dataplane keeps).
	Update(n dataplane.ServicePortName, old, sp *dataplane.ServicePort) *dataplane.ServicePort
	// Delete adds the writes that remove port n (recorded as old).
	Delete(n dataplane.ServicePortName, old *dataplane.ServicePort)
	// Prune ends the updates of a full Sync: the kernel's objects that no
	// recorded port uses are removed.
	Prune(applied map[dataplane.ServicePortName]*dataplane.ServicePort)
	// Commit writes the current batch into the kernel atomically; last
	// is set for the Sync's final batch. An error: nothing of the batch
	// was applied, and the dataplane has put its own records back.
	Commit(last bool) error
	// Done ends a Sync whose batches all committed.
	Done(full bool)
}

// Result is what one Sync did.
type Result struct {
	// Full: the Sync was full (asked, the first, after a failure, or the
	// dataplane's objects were gone).
	Full bool
	// Written counts the Service ports written (updated or deleted).
	Written int
}

// Summary is the engine's status for metrics and health checks.
type Summary struct {
	// Synced: the last Sync succeeded.
	Synced bool
	// Ports counts the recorded Service ports; Pending and Failed those
	// waiting to be written.
	Ports, Pending, Failed int
}

// Engine reconciles one dataplane's Service ports. It is not safe for
// concurrent use: the agent calls Sync one at a time.
type Engine struct {
	rec record
	// status holds the ports that are not Done: a sync at 10,000
	// Services keeps no entry per port that the kernel holds.
	status map[dataplane.ServicePortName]Status
	synced bool
}

// New returns an engine that has written nothing: its first Sync is full.
func New() *Engine {
	return &Engine{rec: newRecord(), status: map[dataplane.ServicePortName]Status{}}
}

// Synced reports whether the last Sync succeeded (false before the first).
func (e *Engine) Synced() bool { return e.synced }

// Applied returns the recorded value of port n (nil: none).
func (e *Engine) Applied(n dataplane.ServicePortName) *dataplane.ServicePort { return e.rec.ports[n] }

// AppliedPorts returns the record (read only).
func (e *Engine) AppliedPorts() map[dataplane.ServicePortName]*dataplane.ServicePort {
	return e.rec.ports
}

// AppliedOf returns the recorded ports of Service svc (read only).
func (e *Engine) AppliedOf(svc dataplane.ServiceName) []dataplane.ServicePortName {
	return e.rec.bySvc[svc]
}

// Status returns where port n stands.
func (e *Engine) Status(n dataplane.ServicePortName) Status {
	if s, ok := e.status[n]; ok {
		return s
	}
	if e.rec.ports[n] != nil {
		return Done
	}
	return Unknown
}

// Summary returns the counts for metrics and health.
func (e *Engine) Summary() Summary {
	s := Summary{Synced: e.synced, Ports: len(e.rec.ports)}
	for _, st := range e.status {
		switch st {
		case Pending:
			s.Pending++
		case Failed:
			s.Failed++
		}
	}
	return s
}

// Reset forgets everything (the dataplane removed its objects): the next
// Sync is full and writes every port.
func (e *Engine) Reset() {
	e.rec = newRecord()
	e.status = map[dataplane.ServicePortName]Status{}
	e.synced = false
}

// Sync makes the kernel hold s through ops, as req asks. A failed Sync
// leaves the ports of committed batches Done, those of the refused batch
// Failed and the rest Pending; the next Sync is full and writes them.
func (e *Engine) Sync(s dataplane.State, req dataplane.SyncRequest, ops Ops) (Result, error) {
	full := req.Full || !e.synced
	if !full && !ops.Intact() {
		full = true // Intact logged why, in the dataplane's words
	}
	var desired map[dataplane.ServicePortName]*dataplane.ServicePort
	var todo []dataplane.ServicePortName
	// Ports left unwritten by a failed Sync need the whole desired state
	// (they are written whatever changed).
	if !full && req.Changed != nil && len(e.status) == 0 {
		desired, todo = e.changedPorts(s, req.Changed, ops)
	}
	if desired == nil {
		desired, todo = e.allPorts(s, req.MayHaveChanged, ops)
	}
	inTodo := make(map[dataplane.ServicePortName]bool, len(todo))
	for _, n := range todo {
		inTodo[n] = true
	}
	// Ports an earlier Sync did not get written: again, whatever changed.
	for n := range e.status {
		if !inTodo[n] && (desired[n] != nil || e.rec.ports[n] != nil) {
			inTodo[n] = true
			todo = append(todo, n)
		}
	}
	plan, err := ops.Begin(full, e.rec.ports)
	if err != nil {
		// It may have written (a jump ensured): the next Sync is full.
		e.synced = false
		return Result{}, err
	}
	for _, n := range plan.Rewrite {
		if desired[n] != nil && !inTodo[n] {
			inTodo[n] = true
			todo = append(todo, n)
		}
	}
	// Removals first: what they free (an entry point a new port reuses in
	// the same Sync) is free before the new owner writes it.
	slices.SortFunc(todo, func(a, b dataplane.ServicePortName) int {
		if ga, gb := desired[a] == nil, desired[b] == nil; ga != gb {
			if ga {
				return -1
			}
			return 1
		}
		return strings.Compare(a.String(), b.String())
	})
	e.status = make(map[dataplane.ServicePortName]Status, len(todo))
	for _, n := range todo {
		e.status[n] = Pending
	}
	var batch []dataplane.ServicePortName
	commit := func(last bool) error {
		if err := ops.Commit(last); err != nil {
			e.rec.undo()
			for _, n := range batch {
				e.status[n] = Failed
			}
			e.synced = false
			return err
		}
		e.rec.keep()
		for _, n := range batch {
			delete(e.status, n)
		}
		batch = batch[:0]
		return nil
	}
	for _, n := range todo {
		old := e.rec.ports[n]
		if sp := desired[n]; sp != nil {
			e.rec.set(n, ops.Update(n, old, sp))
		} else {
			ops.Delete(n, old)
			e.rec.set(n, nil)
		}
		batch = append(batch, n)
		if plan.Batch > 0 && len(batch) >= plan.Batch {
			if err := commit(false); err != nil {
				return Result{}, err
			}
		}
	}
	if full {
		ops.Prune(e.rec.ports)
	}
	if err := commit(true); err != nil {
		return Result{}, err
	}
	ops.Done(full)
	e.synced = true
	if len(e.status) == 0 {
		// Sized for every port of a full Sync and emptied by the commits:
		// a new map lets the buckets go (1.6 MiB after a first sync of
		// 10,000 Services, BenchmarkHeapAfterFirstSync10kx10).
		e.status = map[dataplane.ServicePortName]Status{}
	}
	return Result{Full: full, Written: len(todo)}, nil
}

// allPorts returns every Service port of s the dataplane wants, and those
// of them to write: new ones, changed ones among those mayHaveChanged
// names, and the recorded ports that s no longer has.
func (e *Engine) allPorts(s dataplane.State, mayHaveChanged func(dataplane.ServicePortName) bool, ops Ops) (map[dataplane.ServicePortName]*dataplane.ServicePort, []dataplane.ServicePortName) {
	desired := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(s.Services))
	for i := range s.Services {
		sp := &s.Services[i]
		if !ops.Wants(sp) {
			continue
		}
		if _, dup := desired[sp.Name]; dup {
			log.WithField("service", sp.Name.String()).Warn("Service port listed twice; the first is kept")
			continue
		}
		desired[sp.Name] = sp
	}
	var todo []dataplane.ServicePortName
	for n, sp := range desired {
		old := e.rec.ports[n]
		if old == nil || mayHaveChanged(n) && !old.Equal(sp) {
			todo = append(todo, n)
		}
	}
	for n := range e.rec.ports {
		if desired[n] == nil {
			todo = append(todo, n)
		}
	}
	return desired, todo
}

// changedPorts is allPorts of a partial Sync that knows the changed
// Services: it trusts the set (the Builder names every Service whose
// ports came, changed or went; TestIncrementalEqualsFullBuild checks it)
// and finds their ports in the sorted State by binary search, so its cost
// follows the change, not the Services. A port listed twice returns nil,
// and allPorts sorts it out. A full Sync compares every port, which
// repairs anything a wrong set would have missed.
func (e *Engine) changedPorts(s dataplane.State, changed map[dataplane.ServiceName]bool, ops Ops) (map[dataplane.ServicePortName]*dataplane.ServicePort, []dataplane.ServicePortName) {
	desired := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(changed))
	for svc := range changed {
		ports := s.PortsOf(svc)
		for i := range ports {
			sp := &ports[i]
			if !ops.Wants(sp) {
				continue
			}
			if _, dup := desired[sp.Name]; dup {
				return nil, nil
			}
			desired[sp.Name] = sp
		}
	}
	var todo []dataplane.ServicePortName
	for n, sp := range desired {
		if old := e.rec.ports[n]; old == nil || !old.Equal(sp) {
			todo = append(todo, n)
		}
	}
	for svc := range changed {
		for _, n := range e.rec.bySvc[svc] {
			if desired[n] == nil {
				todo = append(todo, n)
			}
		}
	}
	return desired, todo
}
