package nftables

import "github.com/steelyard-net/steelyard/dataplane"

// record is what steelyard wrote into the kernel: the Service port each
// port's objects were rendered from and the owner of every shared map
// element. A sync changes
// it in place while it builds a transaction and journals each change;
// keep forgets the journal once the kernel committed, undo replays it
// backwards when the commit failed, so the record never disagrees with
// the kernel. (The sync used to copy both maps every time: at 10,000
// Services about 10,000 ports and as many owners per one-endpoint change.)
//
// It keeps what a port was rendered from, not the rendered objects: a
// sync renders a port's old objects again when it rewrites that port.
// The rendered rule text of 10,000 Services x 10 endpoints was 45 MB of
// the 72 MB heap the dataplane kept (pprof inuse_space after the first
// sync), the ServicePorts are 9.5 MB. So renderPort must be a function of
// its ServicePort and the Proxier's Config alone.
type record struct {
	ports map[dataplane.ServicePortName]*dataplane.ServicePort
	// bySvc lists the ports of each Service, so a partial sync finds the
	// ports of a changed Service that are gone without a scan of ports.
	bySvc map[dataplane.ServiceName][]dataplane.ServicePortName
	// owner says which Service port owns each shared map element, so two
	// Service ports sharing a VIP cannot overwrite each other.
	owner   map[elemID]dataplane.ServicePortName
	journal []undoEntry
}

// undoEntry is the value one key had before a change: the owner of the
// shared element id, or (elem false) the objects of port n.
type undoEntry struct {
	elem  bool
	id    elemID
	n     dataplane.ServicePortName // the owner, or the port
	sp    *dataplane.ServicePort
	bySvc []dataplane.ServicePortName
	had   bool
}

func newRecord() *record {
	return &record{
		ports: map[dataplane.ServicePortName]*dataplane.ServicePort{},
		bySvc: map[dataplane.ServiceName][]dataplane.ServicePortName{},
		owner: map[elemID]dataplane.ServicePortName{},
	}
}

// setPort records that port n holds the objects rendered from sp (nil:
// none); sp is the renderPort's copy, which nobody changes.
func (r *record) setPort(n dataplane.ServicePortName, sp *dataplane.ServicePort) {
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

// touchOwners journals the owners of ids before a writer changes them in
// place.
func (r *record) touchOwners(es []elem) {
	for _, e := range es {
		id := e.id()
		prev, had := r.owner[id]
		r.journal = append(r.journal, undoEntry{elem: true, id: id, n: prev, had: had})
	}
}

// keep forgets the journal: the kernel committed what the record says.
func (r *record) keep() { r.journal = r.journal[:0] }

// undo replays the journal backwards: the record is again what the kernel
// held before the failed transaction.
func (r *record) undo() {
	for i := len(r.journal) - 1; i >= 0; i-- {
		e := r.journal[i]
		if e.elem {
			if e.had {
				r.owner[e.id] = e.n
			} else {
				delete(r.owner, e.id)
			}
			continue
		}
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
