package nftables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
	"github.com/steelyard-net/steelyard/internal/execx"
)

// Sync implements dataplane.Dataplane on the reconcile engine, which
// decides full or partial, finds the Service ports to write (of
// req.Changed, the Builder's set; all of them when it is nil), batches
// them and keeps their record; syncOps below are this dataplane's
// operations. The result asks for another Sync when stale objects wait
// for their delayed deletion.
//
// A partial sync writes the objects of the changed ports in one
// transaction. A full sync (the first, or asked for) lists the table's
// names over netlink (not "nft list table" text), rewrites the fixed chains,
// repairs the shared maps from their live elements, rewrites every
// Service port that changed or lost an object, and marks objects that
// nothing uses for deletion; into an empty table it runs in transactions of BatchPorts
// Service ports. A full sync whose ruleset generation shows no commit but
// ours since the table was last listed skips the listing and the fixed
// chains, and compares every Service port with what it wrote
// (generation.go).
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	start := time.Now()
	p.lastOps = 0
	// Under the agent's shutdown context: SIGTERM kills an nft in flight
	// (a killed transaction commits nothing).
	ctx, cancel := context.WithTimeout(execx.Context(), syncTimeout)
	defer cancel()
	ops := &syncOps{p: p, ctx: ctx}
	res, err := p.eng.Sync(s, req, ops)
	if err != nil {
		return dataplane.SyncResult{}, err
	}
	log.WithFields(logrus.Fields{"full": res.Full, "listed": ops.listing, "services": len(p.eng.AppliedPorts()), "written": res.Written, "took": time.Since(start)}).Debug("synced")
	return dataplane.SyncResult{Full: res.Full, RequeueAfter: p.PendingCleanup(), Written: res.Written}, nil
}

// syncOps are the nftables dataplane's operations of one Sync
// (reconcile.Ops): one transaction per batch.
type syncOps struct {
	p   *Proxier
	ctx context.Context
	// listing: this full sync lists the table to repair it; batched: it
	// writes into an empty table, in transactions of BatchPorts ports.
	listing, batched bool
	live             *liveNames
	// rendered holds the objects of every port while a sync that listed
	// the table compares and repairs them; other syncs render only the
	// ports they rewrite.
	rendered map[dataplane.ServicePortName]*portObjects
	w        *writer
	tx       *ops
	nodeIPs  []string
}

var _ reconcile.Ops = (*syncOps)(nil)

// Wants implements reconcile.Ops: the ports of the table's family.
func (o *syncOps) Wants(sp *dataplane.ServicePort) bool { return sp.Family() == o.p.cfg.Family }

// Intact implements reconcile.Ops: "nft flush ruleset" or a deleted table
// removed every object, and a partial sync would write only what changed
// (the iptables mode's canary rule, here the table itself).
func (o *syncOps) Intact() bool {
	if o.p.tableThere(o.ctx) {
		return true
	}
	log.Warn("table steelyard is gone (flushed?): full resync")
	return false
}

// Begin implements reconcile.Ops: it lists the table when a full sync
// must repair it, and writes the fixed chains and the node addresses.
func (o *syncOps) Begin(full bool, applied map[dataplane.ServicePortName]*dataplane.ServicePort) (reconcile.Plan, error) {
	p := o.p
	synced := p.eng.Synced()
	// A full resync reads the table to repair what others changed; when
	// the ruleset generation says nobody committed since our last write,
	// the table is what we wrote and listing it (seconds at 10,000
	// Services) would find nothing to repair.
	o.listing = full && !(synced && p.gen.unchanged(p.cfg.Family))
	p.lastListed = o.listing
	// Only a sync into an empty table (the node's first) runs in batches of
	// BatchPorts Service ports, so it never holds the nftables lock for the
	// whole table; there a kill between batches leaves ports missing, not
	// wrong. Every other sync is one transaction: a SIGTERM measured
	// mid-way through a batched 5,000-port change left neither the old
	// state nor the new one.
	o.batched = !synced && !p.tableThere(o.ctx)
	var plan reconcile.Plan
	if o.batched {
		plan.Batch = BatchPorts
	}
	if o.listing {
		gen, gerr := uint32(0), error(nil)
		if p.gen.read != nil {
			gen, gerr = p.gen.read()
		}
		var err error
		if o.live, err = p.listLive(o.ctx); err != nil {
			p.gen.drop()
			return plan, err
		}
		p.gen.listed(p.cfg.Family, gen, gerr)
		p.shardMaps = map[string]bool{}
		for m := range o.live.maps {
			if sharedMap(m) {
				p.shardMaps[m] = true
			}
		}
		if !o.batched {
			o.rendered = make(map[dataplane.ServicePortName]*portObjects, len(applied))
		}
		// A port whose objects are missing from the kernel is rewritten
		// (an empty table has none of them).
		for n, sp := range applied {
			if o.rendered != nil {
				o.rendered[n] = p.renderPort(sp)
			}
			if o.batched || !o.live.hasAll(o.rendered[n]) {
				plan.Rewrite = append(plan.Rewrite, n)
			}
		}
	}
	// The writer changes the record's owners in place, journaled
	// (record.go): a failed commit puts them back.
	o.w = &writer{p: p, full: o.listing, live: o.live, seen: map[elemID]bool{}, owner: p.rec.owner}
	o.tx = &ops{}
	o.nodeIPs = p.nodeAddrs()
	if o.listing || !synced {
		p.skeleton(o.tx)
	}
	if o.listing || !slices.Equal(o.nodeIPs, p.nodeIPs) {
		o.tx.Flush(&knftables.Set{Name: setNodePortIPs})
		for _, a := range o.nodeIPs {
			o.tx.Add(&knftables.Element{Set: setNodePortIPs, Key: []string{a}})
		}
	}
	return plan, nil
}

// Update implements reconcile.Ops: the difference between the objects
// rendered from old and from sp. It records the render's copy of sp.
func (o *syncOps) Update(n dataplane.ServicePortName, old, sp *dataplane.ServicePort) *dataplane.ServicePort {
	return o.write(n, old, sp)
}

// Delete implements reconcile.Ops.
func (o *syncOps) Delete(n dataplane.ServicePortName, old *dataplane.ServicePort) {
	o.write(n, old, nil)
}

func (o *syncOps) write(n dataplane.ServicePortName, oldSP, sp *dataplane.ServicePort) *dataplane.ServicePort {
	p := o.p
	var old, obj *portObjects
	if o.rendered != nil {
		old = o.rendered[n]
	} else if oldSP != nil {
		old = p.renderPort(oldSP)
	}
	if sp != nil {
		obj = p.renderPort(sp)
	}
	if old != nil {
		p.rec.touchOwners(old.elems)
	}
	var src *dataplane.ServicePort
	if obj != nil {
		p.rec.touchOwners(obj.elems)
		src = obj.src
	}
	o.w.port(o.tx, n, old, obj)
	if o.rendered != nil {
		if obj == nil {
			delete(o.rendered, n)
		} else {
			o.rendered[n] = obj
		}
	}
	return src
}

// Prune implements reconcile.Ops: a sync that listed the table deletes
// what no port uses. Into an empty table every port was written just now:
// nothing to repair, nothing stale.
func (o *syncOps) Prune(map[dataplane.ServicePortName]*dataplane.ServicePort) {
	if o.listing && !o.batched {
		o.w.repair(o.tx, o.rendered)
	}
}

// Commit implements reconcile.Ops: one transaction. The last one also
// carries the hairpin set's changes and the deletion of stale objects.
func (o *syncOps) Commit(last bool) error {
	p := o.p
	if last {
		o.w.hairpinOps(o.tx)
		o.w.reap(o.tx)
	}
	if o.tx.NumOperations() == 0 {
		p.rec.keep()
		return nil
	}
	// Each transaction has its own timeout: a first sync of 30,000
	// Services is thirty of them.
	rctx, rcancel := context.WithTimeout(execx.Context(), syncTimeout)
	defer rcancel()
	commit := p.commit
	if o.batched {
		commit = p.commitBatch // elements over netlink (firstsync.go)
	}
	// Marks the start of a kernel write in the log: the kill test
	// (test/k8s) kills the agent right after it.
	log.WithField("ops", o.tx.NumOperations()).Debug("committing")
	if err := commit(rctx, o.tx); err != nil {
		p.rec.undo()
		return fmt.Errorf("nftables: %w", err)
	}
	// What is in the kernel now is what the record says.
	p.rec.keep()
	o.w.sharedCommitted()
	o.tx = &ops{}
	return nil
}

// Done implements reconcile.Ops: the sync's bookkeeping once everything
// committed.
func (o *syncOps) Done(bool) {
	p := o.p
	p.nodeIPs = o.nodeIPs
	o.w.hairpinCommit()
	o.w.sharedDone()
	for k, t := range o.w.stale {
		p.stale[k] = t
	}
	for k := range o.w.reaped {
		delete(p.stale, k)
	}
}

// commit applies one transaction atomically: over netlink when every
// operation has a netlink encoding (no nft cache to fill), else with nft -f.
func (p *Proxier) commit(ctx context.Context, t *ops) (err error) {
	p.lastOps = len(t.list)
	gen0, ok0 := p.gen.before()
	defer func() { p.gen.after(gen0, ok0, err == nil) }()
	if p.netlink != nil {
		c, err := p.netlink.build(t)
		var unsupported errUnsupported
		switch {
		case err == nil:
			p.lastNetlink = true
			return c.Flush()
		case !errors.As(err, &unsupported):
			return err
		}
		log.WithField("reason", err.Error()).Debug("transaction goes through nft")
	}
	p.lastNetlink = false
	if r, ok := p.nft.(*childRunner); ok {
		text, err := t.script(r.NewTransaction, p.f)
		if err != nil {
			return err
		}
		return r.runScript(ctx, text)
	}
	tx := p.nft.NewTransaction()
	t.into(tx, p.f)
	return p.nft.Run(ctx, tx)
}

// writer adds the operations of one Sync to its transactions.
type writer struct {
	p     *Proxier
	full  bool
	live  *liveNames
	owner map[elemID]dataplane.ServicePortName
	// seen are the shared elements a full sync wrote or found right.
	seen   map[elemID]bool
	stale  map[staleKey]time.Time
	reaped map[staleKey]bool
	// The hairpin set (hairpin.go): a partial sync's changes of the
	// reference counts, the elements a full sync wrote or found, and the
	// counts a full sync derived from every applied port.
	hpDelta map[hairpinKey]int
	hpSeen  map[hairpinKey]bool
	hpRefs  map[hairpinKey]int
	// The shared weight maps (weightmaps.go): created and flushed by this
	// sync, the ports it wrote, the places to free when it is done.
	created, flushed map[string]bool
	written          map[dataplane.ServicePortName]bool
	freed            []placeKey
}

func (w *writer) markStale(kind, name string) {
	k := staleKey{kind, name}
	if _, waiting := w.p.stale[k]; waiting {
		return // keeps the time it was first flushed
	}
	if w.stale == nil {
		w.stale = map[staleKey]time.Time{}
	}
	w.stale[k] = w.p.now()
}

// revive keeps a name that is used again from being deleted later.
func (w *writer) revive(kind, name string) {
	k := staleKey{kind, name}
	delete(w.stale, k)
	if _, ok := w.p.stale[k]; ok {
		if w.reaped == nil {
			w.reaped = map[staleKey]bool{}
		}
		w.reaped[k] = true
	}
}

// port writes the difference between old and o (either may be nil) for
// Service port n. In a full sync every object of o is rewritten.
func (w *writer) port(tx txn, n dataplane.ServicePortName, old, o *portObjects) {
	prev := old
	if prev == nil {
		prev = &portObjects{}
	}
	if old == nil || w.full {
		old = &portObjects{chains: map[string][]rule{}, maps: map[string]*weightMap{}, sets: map[string]int{}, elems: oldElems(old)}
	}
	if o == nil {
		o = &portObjects{chains: map[string][]rule{}, maps: map[string]*weightMap{}, sets: map[string]int{}}
	}
	comment := knftables.PtrTo(commentOf(n, ""))
	// 1. New objects, empty, so everything below may refer to them.
	for _, c := range o.order {
		if _, ok := old.chains[c]; !ok {
			tx.Add(&knftables.Chain{Name: c})
			w.revive("chain", c)
		}
	}
	for _, s := range sortedKeys(o.sets) {
		if t, ok := old.sets[s]; !ok || t != o.sets[s] {
			if ok {
				tx.Delete(&knftables.Set{Name: s}) // the timeout changed: its rules are flushed below
			}
			tx.Add(&knftables.Set{Name: s, Type: w.p.f.addrType, Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
				Timeout: knftables.PtrTo(time.Duration(o.sets[s]) * time.Second)})
			w.revive("set", s)
		}
	}
	for _, m := range sortedKeys(o.maps) {
		if sharedMap(m) {
			w.ensureShared(tx, m, o.maps[m])
			continue
		}
		if _, ok := old.maps[m]; !ok {
			typeOf := weightMapKey + o.maps[m].data(w.p.f)
			var mc *string
			if countedMap(m) {
				// knftables has no field for a set's "counter" statement:
				// it follows the typeof. The comment names the Service
				// port and its protocol for Counts (the key, the draw
				// alone, no longer carries the protocol).
				typeOf += " ; counter"
				mc = knftables.PtrTo(commentOf(n, " "+protoName(o.maps[m].proto)))
			}
			tx.Add(&knftables.Map{Name: m, TypeOf: typeOf, Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: mc})
			w.revive("map", m)
		}
	}
	// 2. Shared elements that go or change.
	newElems := map[elemID]elem{}
	for _, e := range o.elems {
		if owner, taken := w.owner[e.id()]; taken && owner != n {
			log.WithFields(logrus.Fields{"service": n.String(), "entry": e.id(), "kept": owner.String()}).Warn("two Service ports share an entry point; the first is kept")
			continue
		}
		newElems[e.id()] = e
	}
	for _, e := range old.elems {
		if w.owner[e.id()] != n {
			continue
		}
		ne, ok := newElems[e.id()]
		switch {
		case ok && (w.full || ne.to == e.to):
			continue // unchanged, or compared with the kernel below
		case !w.full:
			tx.DeleteElem(sharedElem{e: e})
		}
		// In a full sync, repair deletes what the kernel still has.
		delete(w.owner, e.id())
	}
	// 3. Chains whose rules changed. A chain the kernel does not have yet
	// is not flushed: at 10,000 Services the first sync's flushes of new
	// chains and maps cost as much as the rest of the load.
	for _, c := range o.order {
		rs, ok := old.chains[c]
		if ok && rulesEqual(rs, o.chains[c]) {
			continue
		}
		if w.exists("chain", c, ok) {
			tx.Flush(&knftables.Chain{Name: c})
		}
		for _, r := range o.chains[c] {
			tx.AddRule(c, comment, r)
		}
	}
	// 4. Weight maps whose elements changed: a shared map's elements of
	// this port, a counted map (one per port) flushed and written again.
	w.sharedElems(tx, n, prev, o)
	for _, m := range sortedKeys(o.maps) {
		if sharedMap(m) {
			continue
		}
		if om, ok := old.maps[m]; ok && slices.Equal(om.elems, o.maps[m].elems) {
			continue
		} else if w.exists("map", m, ok) {
			tx.Flush(&knftables.Map{Name: m})
		}
		wm := o.maps[m]
		for i := range wm.elems {
			tx.AddElem(mapElem{m, wm.proto, &wm.elems[i]})
		}
	}
	w.hairpinPort(tx, old, o)
	// 5. Shared elements that come.
	for _, id := range sortedIDs(newElems) {
		e := newElems[id]
		w.seen[id] = true
		if _, mine := w.owner[id]; mine && !w.full {
			continue // unchanged
		}
		if w.full {
			if le, ok := w.live.elems[id]; ok {
				if le.to == e.to {
					w.owner[id] = n
					continue
				}
				tx.DeleteElem(sharedElem{e: e})
			}
		}
		tx.AddElem(sharedElem{e, knftables.PtrTo(commentOf(n, e.kind))})
		w.owner[id] = n
	}
	// 6. Objects no longer used: left as they are now, flushed and deleted
	// after StaleDelay (reap). Not flushed now: the kernel activates this
	// transaction's rules before a concatenated interval map swaps in its
	// new elements, so for a moment the old elements still send packets to
	// a chain removed from the split; flushed, that chain would let them
	// through without DNAT (the churn test saw timeouts: 3-6 of 100,000).
	for c := range old.chains {
		if _, ok := o.chains[c]; !ok {
			w.markStale("chain", c)
		}
	}
	for m := range old.maps {
		if _, ok := o.maps[m]; !ok && !sharedMap(m) {
			w.markStale("map", m)
		}
	}
	for s := range old.sets {
		if _, ok := o.sets[s]; !ok {
			w.markStale("set", s)
		}
	}
}

// exists reports whether the kernel may hold an object already: in a full
// sync, from the names listed; else when the last sync wrote it or it
// waits for deletion.
func (w *writer) exists(kind, name string, written bool) bool {
	if w.full {
		switch kind {
		case "chain":
			return w.live.chains[name]
		case "map":
			return w.live.maps[name]
		}
		return w.live.sets[name]
	}
	_, waiting := w.p.stale[staleKey{kind, name}]
	return written || waiting
}

// oldElems keeps the shared elements of old for the delete step.
func oldElems(old *portObjects) []elem {
	if old == nil {
		return nil
	}
	return old.elems
}

// repair ends a full sync: shared elements nobody owns are deleted, and
// per Service objects of the table that no Service port uses are deleted
// after StaleDelay: leftovers of a previous run or of hands.
func (w *writer) repair(tx txn, applied map[dataplane.ServicePortName]*portObjects) {
	w.repairShared(tx, applied)
	used := map[string]bool{}
	for _, n := range sortedPorts(applied) {
		o := applied[n]
		for c := range o.chains {
			used["chain "+c] = true
		}
		for m := range o.maps {
			used["map "+m] = true
		}
		for s := range o.sets {
			used["set "+s] = true
		}
		// The elements of ports this sync did not rewrite: compared with
		// the kernel, written again if they differ.
		for _, e := range o.elems {
			if w.seen[e.id()] || w.owner[e.id()] != n {
				continue
			}
			w.seen[e.id()] = true
			le, ok := w.live.elems[e.id()]
			if ok && le.to == e.to {
				continue
			}
			if ok {
				tx.DeleteElem(sharedElem{e: e})
			}
			tx.AddElem(sharedElem{e, knftables.PtrTo(commentOf(n, e.kind))})
		}
	}
	for _, id := range sortedIDs(w.live.elems) {
		if w.seen[id] {
			continue
		}
		tx.DeleteElem(sharedElem{e: w.live.elems[id]})
	}
	w.hairpinRepair(tx, applied)
	perPort := func(name string) bool {
		for _, pfx := range []string{svcPrefix, svlPrefix, extPrefix, fwPrefix, epPrefix, affPrefix, wPrefix + "c-", wPrefix + "l-", dnatPrefix + "c-", dnatPrefix + "l-", countPrefix + "c-", countPrefix + "l-", sharedDNATPrefix, sharedUDPPrefix, sharedSCTPPrefix, sharedVerdictPrefix,
			legacyCountPrefix + "c-", legacyCountPrefix + "l-", legacyDNATPrefix, legacyVerdictPrefix} {
			if strings.HasPrefix(name, pfx) {
				return true
			}
		}
		return false
	}
	for _, c := range sortedKeys(w.live.chains) {
		if perPort(c) && !used["chain "+c] {
			w.markStale("chain", c)
		}
	}
	for _, m := range sortedKeys(w.live.maps) {
		if perPort(m) && !used["map "+m] {
			w.markStale("map", m)
		}
	}
	for _, s := range sortedKeys(w.live.sets) {
		if perPort(s) && !used["set "+s] {
			w.markStale("set", s)
		}
	}
}

// reap deletes the stale objects whose StaleDelay has passed: maps and sets
// first (their elements and rules refer to chains), then chains.
func (w *writer) reap(tx txn) {
	now := w.p.now()
	var due []staleKey
	for k, t := range w.p.stale {
		if now.Sub(t) >= StaleDelay && !w.reaped[k] {
			if _, again := w.stale[k]; again {
				continue
			}
			due = append(due, k)
		}
	}
	order := map[string]int{"map": 0, "set": 1, "chain": 2}
	slices.SortFunc(due, func(a, b staleKey) int {
		if order[a.kind] != order[b.kind] {
			return order[a.kind] - order[b.kind]
		}
		return strings.Compare(a.name, b.name)
	})
	// Flush the chains first: a stale chain may jump to another one (ext-
	// to svc-) or use a stale map, and a referenced object is not deleted.
	for _, k := range due {
		if k.kind == "chain" {
			tx.Flush(&knftables.Chain{Name: k.name})
		}
	}
	for _, k := range due {
		switch k.kind {
		case "map":
			tx.Delete(&knftables.Map{Name: k.name})
		case "set":
			tx.Delete(&knftables.Set{Name: k.name})
		case "chain":
			tx.Delete(&knftables.Chain{Name: k.name})
		}
		if w.reaped == nil {
			w.reaped = map[staleKey]bool{}
		}
		w.reaped[k] = true
	}
}

// commentOf is the comment of Service port n's rules (kind "") and shared
// elements (kind: the entry point's suffix, which explain reads back): the
// name shortened to fit nft's limit together with kind. nft refuses a whole
// transaction for one longer comment, so one long Gateway route name
// stopped every sync while it existed (conformance
// UDPRouteParentRefPortAndSectionName, 136 bytes with its listener).
func commentOf(n dataplane.ServicePortName, kind string) string {
	return dataplane.ShortName(n.String(), dataplane.NftCommentMax-len(kind)) + kind
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedPorts[V any](m map[dataplane.ServicePortName]V) []dataplane.ServicePortName {
	out := make([]dataplane.ServicePortName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b dataplane.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// isNotFound reports a missing table, as nft or netlink says it.
func isNotFound(err error) bool {
	return err != nil && (knftables.IsNotFound(err) || errors.Is(err, syscall.ENOENT) ||
		strings.Contains(strings.ToLower(err.Error()), "no such file or directory"))
}
