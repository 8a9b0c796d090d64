package ipvs

import (
	"errors"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
)

// Sync reconciles the kernel with s by difference, on the reconcile
// engine (which decides full or partial: asked, the first Sync, after a
// failure, or the canary finding the interface or a VIP gone) with
// vsOps as this dataplane's operations. A full Sync reads the whole live
// IPVS table (steelyard's part of it), the dummy interface and the sets,
// and re-ensures sysctls and rules; a partial one reads back only the
// virtual servers whose desired state changed or that have draining
// destinations. Unlike iptables-restore, IPVS has no transaction: a failed
// write is reported, the rest still applied, and the next Sync is full.
// While destinations drain, the result asks for another Sync soon, so they
// are deleted shortly after their last connection ends.
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping() {
		return dataplane.SyncResult{}, ErrShutdown
	}
	o := &vsOps{p: p, s: s, req: req, start: p.cfg.Now()}
	r, err := p.eng.Sync(s, req, o)
	if err != nil {
		return dataplane.SyncResult{}, err
	}
	res := dataplane.SyncResult{Full: p.LastSync.Full, Written: r.Written}
	if p.LastSync.Draining > 0 {
		res.RequeueAfter = drainCheckInterval
	}
	return res, nil
}

// vsOps are the IPVS dataplane's operations of one Sync (reconcile.Ops).
// Virtual servers are keyed by VIP, which several Service ports' entry
// points may share, and the sets and addresses are shared by all: the
// desired virtual servers are built whole (those of unchanged ports
// reused, desired.go) and written VIP by VIP in Commit; Update and Delete
// write nothing of their own.
type vsOps struct {
	p     *Proxier
	s     dataplane.State
	req   dataplane.SyncRequest
	start time.Time
	// canaryMissing: the canary found applied objects gone; gone are the
	// virtual servers a partial Sync re-adds.
	canaryMissing bool
	gone          map[dataplane.VIP]bool
	full          bool
	want          map[dataplane.VIP]*wantService
	live          map[dataplane.VIP]*liveService
	stats         SyncStats
}

var _ reconcile.Ops = (*vsOps)(nil)

// Wants implements reconcile.Ops: every port of the State (desired.go
// leaves out those of the other family).
func (o *vsOps) Wants(*dataplane.ServicePort) bool { return true }

// Intact implements reconcile.Ops: false when the interface or a VIP on
// it is gone, or the kernel could not be read: repair all. Virtual
// servers another tool deleted (ipvsadm -C) are re-added by this partial
// Sync, over netlink: a full Sync would also re-read the sets and the
// iptables rules, which such a flush does not touch (under TCG its ipset
// and iptables-save children made the repair take 0.7-2.6 s instead of
// milliseconds).
func (o *vsOps) Intact() bool {
	missing, ok := o.p.canary()
	o.canaryMissing = !ok || len(missing) > 0
	o.gone = missing
	return ok
}

// Begin implements reconcile.Ops: the desired virtual servers, the setup
// of a full Sync, the live state, then the sets and addresses (the sets
// first: the masquerade rules must know a VIP before its first packet is
// forwarded).
func (o *vsOps) Begin(full bool, _ map[dataplane.ServicePortName]*dataplane.ServicePort) (reconcile.Plan, error) {
	p := o.p
	o.full = full
	nodeAddrs, err := p.nodeAddresses(o.s)
	if err != nil {
		return reconcile.Plan{}, err
	}
	// Asked full or the first (or after a failure): build every port;
	// one made full by the canary reuses the unchanged ports' build.
	req := o.req
	req.Full = full && !(o.canaryMissing && o.gone == nil)
	o.want = p.desired(o.s, nodeAddrs, req)
	o.stats = SyncStats{Full: full, CanaryMissing: o.canaryMissing, Services: len(o.want)}
	if full {
		if err := p.setup(); err != nil {
			p.applied, p.ready = nil, false
			return reconcile.Plan{}, err
		}
	}
	o.live, err = p.readLive(o.want, full, o.gone, &o.stats)
	if err != nil {
		p.applied = nil
		return reconcile.Plan{}, err
	}
	return reconcile.Plan{}, nil
}

// Update implements reconcile.Ops: the port is in the desired virtual
// servers. The engine records sp for its changed set only.
func (o *vsOps) Update(_ dataplane.ServicePortName, _, sp *dataplane.ServicePort) *dataplane.ServicePort {
	// A copy: a pointer into the State would keep the Builder's whole
	// array of ports alive for as long as this port stays unchanged.
	return sp.Clone()
}

// Delete implements reconcile.Ops: Commit deletes the virtual servers no
// port wants.
func (o *vsOps) Delete(dataplane.ServicePortName, *dataplane.ServicePort) {}

// Prune implements reconcile.Ops: a full Sync's Commit compares every live
// virtual server, set member and address.
func (o *vsOps) Prune(map[dataplane.ServicePortName]*dataplane.ServicePort) {}

// Commit implements reconcile.Ops: the sets, the addresses and the
// virtual servers that differ, written one by one (IPVS has no
// transaction); an error leaves the rest written and the next Sync full.
func (o *vsOps) Commit(bool) error {
	p, want, live, full, gone, stats := o.p, o.want, o.live, o.full, o.gone, &o.stats
	var errs []error
	if err := p.syncSets(want, full); err != nil {
		errs = append(errs, err)
	}
	if err := p.syncAddresses(want, live, full); err != nil {
		errs = append(errs, err)
	}
	now := p.cfg.Now()
	applied := make(map[dataplane.VIP]*liveService, len(want))
	for _, vip := range sortedVIPs(want) {
		if p.stopping() {
			errs = append(errs, ErrShutdown)
			break
		}
		w := want[vip]
		l := live[vip]
		if gone[vip] {
			// Its destinations went with it, the draining ones too.
			delete(p.draining, vip)
		}
		if !full && l != nil && l == p.applied[vip] {
			// readLive found it unchanged and not draining.
			applied[vip] = l
			continue
		}
		ls, n, err := p.syncService(w, l, now)
		stats.DestWrites += n
		if n > 0 || l == nil {
			stats.ServicesWritten++
		}
		if err != nil {
			errs = append(errs, err)
		}
		if ls != nil {
			applied[vip] = ls
		}
	}
	for _, vip := range sortedVIPs(live) {
		if _, ok := want[vip]; ok {
			continue
		}
		if p.stopping() {
			errs = append(errs, ErrShutdown)
			break
		}
		l := live[vip]
		if err := p.ipvs.DeleteVirtualServer(l.vs); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(p.draining, vip)
		stats.ServicesWritten++
		log.WithFields(logrus.Fields{fieldVIP: vip.String(), fieldSvc: l.name}).Debug("deleted virtual server")
	}
	for vip := range p.draining {
		if _, ok := want[vip]; !ok {
			delete(p.draining, vip)
		}
	}
	if err := p.removeStaleAddresses(want, full); err != nil {
		errs = append(errs, err)
	}
	for _, d := range p.draining {
		stats.Draining += len(d)
	}
	if len(errs) > 0 {
		// Redo everything next time, the sets and rules included.
		p.applied, p.ready = nil, false
		return errors.Join(errs...)
	}
	p.applied = applied
	p.appliedWant = make(map[dataplane.VIP]*wantService, len(want))
	for vip, w := range want {
		if applied[vip] != nil && len(p.draining[vip]) == 0 {
			p.appliedWant[vip] = w
		}
	}
	stats.Took = p.cfg.Now().Sub(o.start)
	p.LastSync = *stats
	return nil
}

// Done implements reconcile.Ops.
func (o *vsOps) Done(bool) {}
