package reconcile

import "github.com/steelyard-net/steelyard/dataplane"

// record is what the kernel holds: the Service port each port's objects
// were written from. A Sync changes it in place while it builds a batch
// and journals each change; keep forgets the journal once the kernel
// committed the batch, undo replays it backwards when the commit failed,
// so the record never disagrees with the kernel. (Copying the record per
// Sync cost about 10,000 map entries per one-endpoint change at 10,000
// Services.)
type record struct {
	ports map[dataplane.ServicePortName]*dataplane.ServicePort
	// bySvc lists the ports of each Service, so a partial Sync finds the
	// ports of a changed Service that are gone without a scan of ports.
	bySvc   map[dataplane.ServiceName][]dataplane.ServicePortName
	journal []undoEntry
}

// undoEntry is what port n was before a change.
type undoEntry struct {
	n     dataplane.ServicePortName
	sp    *dataplane.ServicePort
	bySvc []dataplane.ServicePortName
	had   bool
}

func newRecord() record {
	return record{
		ports: map[dataplane.ServicePortName]*dataplane.ServicePort{},
		bySvc: map[dataplane.ServiceName][]dataplane.ServicePortName{},
	}
}

// set records that port n holds what sp says (nil: nothing).
func (r *record) set(n dataplane.ServicePortName, sp *dataplane.ServicePort) {
	old, had := r.ports[n]
	if old == sp {
		return
	}
	svc := n.Service()
	r.journal = append(r.journal, undoEntry{n: n, sp: old, had: had, bySvc: r.bySvc[svc]})
	if sp == nil {
		delete(r.ports, n)
		// A new slice: the journal keeps the old one.
		var rest []dataplane.ServicePortName
		for _, x := range r.bySvc[svc] {
			if x != n {
				rest = append(rest, x)
			}
		}
		if rest == nil {
			delete(r.bySvc, svc)
		} else {
			r.bySvc[svc] = rest
		}
		return
	}
	r.ports[n] = sp
	if !had {
		names := r.bySvc[svc]
		r.bySvc[svc] = append(names[:len(names):len(names)], n)
	}
}

// keep forgets the journal: the kernel committed what the record says.
func (r *record) keep() { r.journal = r.journal[:0] }

// undo replays the journal backwards: the record is again what the kernel
// held before the refused batch.
func (r *record) undo() {
	for i := len(r.journal) - 1; i >= 0; i-- {
		e := r.journal[i]
		if e.had {
			r.ports[e.n] = e.sp
		} else {
			delete(r.ports, e.n)
		}
		if svc := e.n.Service(); e.bySvc == nil {
			delete(r.bySvc, svc)
		} else {
			r.bySvc[svc] = e.bySvc
		}
	}
	r.journal = r.journal[:0]
}
