package nftables

import "github.com/steelyard-net/steelyard/dataplane"

// record is what steelyard wrote into the kernel beyond the Service ports
// the reconcile engine records: the owner of every shared map element. A
// sync changes it in place while it builds a transaction and journals
// each change; keep forgets the journal once the kernel committed, undo
// replays it backwards when the commit failed, so the record never
// disagrees with the kernel. (The sync used to copy it every time: at
// 10,000 Services as many owners per one-endpoint change.)
//
// The engine keeps what a port was rendered from, not the rendered
// objects: a sync renders a port's old objects again when it rewrites
// that port. The rendered rule text of 10,000 Services x 10 endpoints was
// 45 MB of the 72 MB heap the dataplane kept (pprof inuse_space after the
// first sync), the ServicePorts are 9.5 MB. So renderPort must be a
// function of its ServicePort and the Proxier's Config alone.
type record struct {
	// owner says which Service port owns each shared map element, so two
	// Service ports sharing a VIP cannot overwrite each other.
	owner   map[elemID]dataplane.ServicePortName
	journal []undoEntry
}

// undoEntry is the owner the shared element id had before a change.
type undoEntry struct {
	id  elemID
	n   dataplane.ServicePortName
	had bool
}

func newRecord() *record {
	return &record{owner: map[elemID]dataplane.ServicePortName{}}
}

// touchOwners journals the owners of ids before a writer changes them in
// place.
func (r *record) touchOwners(es []elem) {
	for _, e := range es {
		id := e.id()
		prev, had := r.owner[id]
		r.journal = append(r.journal, undoEntry{id: id, n: prev, had: had})
	}
}

// keep forgets the journal: the kernel committed what the record says.
func (r *record) keep() { r.journal = r.journal[:0] }

// undo replays the journal backwards: the owners are again what the
// kernel held before the failed transaction.
func (r *record) undo() {
	for i := len(r.journal) - 1; i >= 0; i-- {
		e := r.journal[i]
		if e.had {
			r.owner[e.id] = e.n
		} else {
			delete(r.owner, e.id)
		}
	}
	r.journal = r.journal[:0]
}
