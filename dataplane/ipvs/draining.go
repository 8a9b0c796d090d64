// Graceful termination: destinations that leave drain at weight 0 until
// their connections end (kube-proxy's graceful_termination.go).

package ipvs

import (
	"net/netip"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// DefaultGracefulPeriod bounds how long a leaving destination drains.
const DefaultGracefulPeriod = 30 * time.Second

// drainCheckInterval is how soon after a Sync that left destinations
// draining the proxier asks for another Sync (SyncResult.RequeueAfter).
const drainCheckInterval = time.Second

// drainGone handles the live destinations of l that w no longer has, as
// kube-proxy's graceful termination does: weight 0 first, so established
// connections go on while new ones go elsewhere, then deleted once idle
// (no active TCP connection or SCTP association; for UDP no entry at all)
// or after GracefulPeriod. It returns the number of writes and the errors.
func (p *Proxier) drainGone(w *wantService, l *liveService, now time.Time, lg *logrus.Entry) (int, []error) {
	vip := w.vs.Key()
	writes := 0
	var errs []error
	for _, addr := range sortedAddrs(l.dests) {
		if _, ok := w.dests[addr]; ok {
			continue
		}
		cur := l.dests[addr]
		d := p.draining[vip]
		if d == nil {
			d = map[netip.AddrPort]time.Time{}
			p.draining[vip] = d
		}
		since, known := d[addr]
		if !known {
			// Also after a restart: a destination found at weight 0 and not
			// desired keeps draining from now on, never raised back
			// (kubernetes#92019).
			since = now
			d[addr] = now
		}
		// SCTP counts as TCP: an association is active until SHUTDOWN
		// (kube-proxy deletes SCTP destinations at once, as UDP ones).
		idle := cur.ActiveConn == 0
		if w.vs.Protocol == dataplane.UDP {
			idle = cur.ActiveConn+cur.InactiveConn == 0
		}
		late := now.Sub(since) >= p.cfg.GracefulPeriod
		if cur.Weight == 0 && known && (idle || late) {
			if err := p.ipvs.DeleteRealServer(w.vs, cur); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(l.dests, addr)
			delete(d, addr)
			writes++
			lg.WithFields(logrus.Fields{fieldBackend: addr.String(), "idle": idle}).Debug("deleted drained destination")
			continue
		}
		if cur.Weight != 0 {
			cur.Weight = 0
			if err := p.ipvs.UpdateRealServer(w.vs, cur); err != nil {
				errs = append(errs, err)
				continue
			}
			l.dests[addr] = cur
			writes++
			lg.WithField(fieldBackend, addr.String()).Debug("destination draining at weight 0")
		}
	}
	return writes, errs
}

func sortedAddrs[T any](m map[netip.AddrPort]T) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// Draining returns the destinations currently draining, per VIP.
func (p *Proxier) Draining() map[dataplane.VIP][]netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[dataplane.VIP][]netip.AddrPort{}
	for vip, d := range p.draining {
		out[vip] = sortedAddrs(d)
	}
	return out
}
