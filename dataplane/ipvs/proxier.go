// Package ipvs is steelyard's IPVS dataplane: every clusterIP, external IP
// and load-balancer IP sits on the dummy interface steelyard0, each entry
// point (those IP:port/protocol, and each node address with a node port) is
// one IPVS virtual service, and each backend one destination in Masq mode
// with an integer weight (weights.go). Sync reconciles by difference: it reads the live table and
// adds, updates and deletes only what differs, so unchanged destinations and
// their connections are never touched. Destinations that leave drain at
// weight 0 until their connections end or the graceful period passes, also
// across restarts (kubernetes#92019). Masquerading for hairpin and
// off-cluster clients, the Local traffic policies and
// loadBalancerSourceRanges are a fixed handful of iptables rules matching
// ipsets (sets.go, rules.go).
//
// A Proxier serves one IP family (Config.Family): IPv6 has its own sets
// (family inet6) and ip6tables rules. Both families share the IPVS table
// and steelyard0, so each Proxier sees them through a view of its own
// family (family.go); DualStack (dualstack.go) runs one Proxier per family.
//
// The files follow the concerns: proxier.go the Sync (read live state,
// reconcile virtual servers), desired.go the desired virtual servers,
// draining.go graceful termination, sets.go the ipsets and their members,
// addresses.go the dummy interface and the node port addresses, rules.go
// the iptables rules, family.go the per-family views.
//
// kube-proxy's pkg/proxy/ipvs is the model (kube-ipvs0, its graceful
// termination manager); this is a smaller design: one Sync owns every write.
package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
	"github.com/steelyard-net/steelyard/internal/execx"
	"github.com/steelyard-net/steelyard/internal/iptables"
)

var log = logrus.WithField("subsys", "ipvs")

// Log field keys.
const (
	fieldVIP     = "vip"
	fieldBackend = "backend"
	fieldWeight  = "weight"
	fieldSvc     = "svc"
)

// DefaultInterface is the dummy interface that holds the VIPs.
const DefaultInterface = "steelyard0"

// DefaultScheduler is the node's scheduler when Config leaves it empty: wrr
// follows weights deterministically.
const DefaultScheduler = "wrr"

// Config configures the IPVS proxier.
type Config struct {
	// Interface is the dummy interface for VIPs; DefaultInterface if empty.
	Interface string
	// Scheduler is the node's scheduler, used where a Service port has no
	// annotation; DefaultScheduler if empty.
	Scheduler string
	// GracefulPeriod is the longest a leaving destination drains at weight
	// 0; DefaultGracefulPeriod if zero.
	GracefulPeriod time.Duration
	// Masquerade says which new connections are masqueraded, as in every
	// dataplane (the IPVS mode's rules match its sets, see rules.go).
	dataplane.Masquerade
	// Now is the clock; time.Now if nil. Tests inject a fake one.
	Now func() time.Time
	// SysctlDir is where sysctls are written; /proc/sys if empty. Tests
	// point it at a temporary directory.
	SysctlDir string
	// NodeAddresses, when set, is called at each Sync for the addresses
	// node ports are open on (one virtual service per address and node
	// port); without it no node port is programmed. Addresses of the other
	// family, link-local ones and those on the dummy interface are left
	// out.
	NodeAddresses func() []netip.Addr
	// Family is the IP family this Proxier programs: 4 (the default) or 6.
	// Service ports of the other family are left to the other Proxier.
	Family int
	// Stop, once closed, makes a Sync in progress stop writing at the next
	// virtual server and fail with ErrShutdown. New sets it to the agent's
	// shutdown context (internal/execx); nil never stops.
	Stop <-chan struct{}
}

// ErrShutdown is the error of a Sync cut short by Config.Stop.
var ErrShutdown = errors.New("ipvs: shutting down: sync stopped before its end")

func (c *Config) defaults() {
	if c.Interface == "" {
		c.Interface = DefaultInterface
	}
	if c.Scheduler == "" {
		c.Scheduler = DefaultScheduler
	}
	if c.GracefulPeriod == 0 {
		c.GracefulPeriod = DefaultGracefulPeriod
	}
	c.MasqueradeBit = c.Bit()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SysctlDir == "" {
		c.SysctlDir = dataplane.ProcSys
	}
	if c.Family != 6 {
		c.Family = 4
	}
}

// is reports whether a belongs to the Proxier's family.
func (c *Config) is(a netip.Addr) bool { return a.Unmap().Is4() == (c.Family == 4) }

// Sysctls are the kernel settings IPVS needs, as kube-proxy sets them:
// conntrack so the masquerade rules see IPVS traffic; conn_reuse_mode 1 so a
// reused client port is scheduled afresh (kernels >= 5.9 have no delay with
// it); expire_nodest_conn and expire_quiescent_template so connections to
// deleted destinations and persistence templates of drained ones end.
// They live under net.ipv4 but apply to IPv6 virtual services as well.
var Sysctls = []struct{ Name, Value string }{
	{"net.ipv4.vs.conntrack", "1"},
	{"net.ipv4.vs.conn_reuse_mode", "1"},
	{"net.ipv4.vs.expire_nodest_conn", "1"},
	{"net.ipv4.vs.expire_quiescent_template", "1"},
}

// Sysctls6 are the IPv6 Proxier's extra settings: IPv6 forwarding, without
// which the node drops the pods' replies before IPVS translates them back
// (IPv4 forwarding is the node's or the CNI's business, as for kube-proxy).
var Sysctls6 = []struct{ Name, Value string }{
	{"net.ipv6.conf.all.forwarding", "1"},
}

// Proxier is the IPVS Dataplane.
type Proxier struct {
	ipvs  Interface
	links Links
	sets  Sets
	ipt   iptables.Interface
	cfg   Config

	mu sync.Mutex
	// ready is set once the sysctls, interface, sets and rules are in place.
	ready bool
	// eng runs the Syncs (the reconcile engine, sync.go).
	eng *reconcile.Engine
	// applied is what the last successful Sync left in the kernel, per VIP
	// (nil at start and after a failure, when the engine makes the next
	// Sync full).
	applied map[dataplane.VIP]*liveService
	// draining holds, per VIP and destination, when it started draining.
	draining map[dataplane.VIP]map[netip.AddrPort]time.Time
	// wantCache holds the last Sync's desired virtual servers by
	// clusterIP VIP; cacheNodeAddrs the node addresses they were built for.
	wantCache      map[dataplane.VIP]*cachedWant
	cacheNodeAddrs []netip.Addr
	// appliedWant is the desired virtual server each applied one was
	// written from: the same pointer again means nothing to compare.
	appliedWant map[dataplane.VIP]*wantService
	// warnedFamily is set once the skipped ports of the other family were
	// logged.
	warnedFamily bool
	// LastSync describes the last successful Sync, for logs and benchmarks.
	LastSync SyncStats
}

// SyncStats describes one Sync.
type SyncStats struct {
	Full bool
	// CanaryMissing: a partial Sync found virtual servers or VIPs it had
	// applied gone from the kernel and ran full instead.
	CanaryMissing   bool
	Services        int
	ServicesRead    int
	ServicesWritten int
	DestWrites      int
	Draining        int
	Took            time.Duration
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// NewProxier returns a Proxier that writes through the given kernel views.
// ipvs and links are shared by both families; the Proxier sees only its
// own family's part of them. sets and ipt are used as they are: the
// Proxier names its sets by family, and ipt must be ip6tables for IPv6.
func NewProxier(ipvs Interface, links Links, sets Sets, ipt iptables.Interface, cfg Config) *Proxier {
	cfg.defaults()
	return &Proxier{ipvs: familyIPVS{ipvs, cfg.Family}, links: familyLinks{links, cfg.Family},
		sets: familySets{sets, cfg.Family}, ipt: ipt, cfg: cfg, eng: reconcile.New(),
		draining: map[dataplane.VIP]map[netip.AddrPort]time.Time{}}
}

// New returns a Proxier of cfg.Family over the real kernel of the current
// network namespace, with iptables (ip6tables for IPv6) of the given
// flavour.
func New(iptMode iptables.Mode, cfg Config) (*Proxier, error) {
	k, err := NewKernel()
	if err != nil {
		return nil, err
	}
	links, err := NewLinks()
	if err != nil {
		return nil, err
	}
	sets, err := NewSets()
	if err != nil {
		return nil, err
	}
	var ipt iptables.Interface
	if cfg.Family == 6 {
		if iptMode == iptables.ModeAuto || iptMode == "" {
			iptMode = iptables.Detect()
		}
		if ipt, err = iptables.New6(iptMode); err == nil {
			_, err = ipt.SaveAll()
		}
		if err != nil {
			return nil, fmt.Errorf("ip6tables: %w", err)
		}
	} else {
		var mode iptables.Mode
		if ipt, mode, err = iptables.New(iptMode); err != nil {
			return nil, err
		}
		log.WithField("iptables", mode).Debug("using iptables for masquerading")
	}
	if cfg.Stop == nil {
		// SIGTERM stops the netlink writes too, not only the ipset and
		// iptables children: a Sync of a 10-Service change writes 40
		// destinations, over a second under TCG, and the agent must exit
		// within 2 s.
		cfg.Stop = execx.Context().Done()
	}
	return NewProxier(k, links, sets, ipt, cfg), nil
}

// liveService is one virtual server and its destinations.
type liveService struct {
	vs    VirtualServer
	name  string
	dests map[netip.AddrPort]RealServer
	// want is the desired virtual server it was last written from (nil
	// when only read from the kernel): its set members, for partial Syncs.
	want *wantService
}

func sortedVIPs[T any](m map[dataplane.VIP]T) []dataplane.VIP {
	out := make([]dataplane.VIP, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b dataplane.VIP) int {
		if c := a.IP.Compare(b.IP); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return strings.Compare(string(a.Protocol), string(b.Protocol))
	})
	return out
}

// setup sets the sysctls and ensures the interface, the sets and the rules.
// After the first success it only checks them (one iptables-save); a failed
// Sync makes the next one redo it all.
func (p *Proxier) setup() error {
	if p.ready {
		if err := p.links.EnsureDummy(p.cfg.Interface); err != nil {
			return err
		}
		if rulesInPlace(p.ipt, p.cfg) {
			return nil
		}
		log.Info("masquerade rules changed behind our back; rewriting them")
	}
	sysctls := Sysctls
	if p.cfg.Family == 6 {
		sysctls = append(slices.Clone(Sysctls), Sysctls6...)
	}
	for _, sc := range sysctls {
		if err := p.setSysctl(sc.Name, sc.Value); err != nil {
			return err
		}
	}
	if err := p.links.EnsureDummy(p.cfg.Interface); err != nil {
		return err
	}
	var create strings.Builder
	for _, st := range setTypes {
		fmt.Fprintf(&create, "create %s %s", st.name, st.typ)
		if p.cfg.Family == 6 {
			create.WriteString(" family inet6")
		}
		create.WriteString("\n")
	}
	if err := p.sets.Restore(create.String()); err != nil {
		return fmt.Errorf("create ipsets: %w", err)
	}
	if err := ensureRules(p.ipt, p.cfg); err != nil {
		return err
	}
	p.ready = true
	return nil
}

func (p *Proxier) setSysctl(name, value string) error {
	err := dataplane.SetSysctlAt(p.cfg.SysctlDir, name, value)
	if errors.Is(err, os.ErrNotExist) && strings.HasPrefix(name, "net.ipv6.") {
		return fmt.Errorf("sysctl %s is missing: IPv6 is off in this kernel or namespace", name)
	}
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sysctl %s is missing: the kernel has no IPVS (load the ip_vs module, or build with CONFIG_IP_VS)", name)
	}
	return err
}

// canary checks that everything the last Sync applied is still there at
// the coarse level a flush or a deleted interface would break: every
// virtual server (one netlink dump) and every VIP on the interface. It
// returns the applied virtual servers that are gone, and false when a VIP
// or the interface is gone or the kernel cannot be read (then only a full
// Sync repairs). It does not read destinations; full Syncs
// (--full-sync-period) repair those.
func (p *Proxier) canary() (map[dataplane.VIP]bool, bool) {
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return nil, false
	}
	live := make(map[dataplane.VIP]bool, len(vss))
	for _, vs := range vss {
		live[vs.Key()] = true
	}
	addrs, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return nil, false
	}
	onLink := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		onLink[a] = true
	}
	var missing map[dataplane.VIP]bool
	for vip, a := range p.applied {
		if a.want != nil && a.want.meta.onDummy() && !onLink[vip.IP] {
			log.WithField(fieldVIP, vip.String()).Info("applied VIP gone from the kernel; running a full sync")
			return nil, false
		}
		if !live[vip] {
			if missing == nil {
				missing = map[dataplane.VIP]bool{}
			}
			missing[vip] = true
		}
	}
	if len(missing) > 0 {
		log.WithFields(logrus.Fields{"missing": len(missing), "applied": len(p.applied)}).Info("applied virtual servers gone from the kernel (another tool flushed IPVS?); re-adding them")
	}
	return missing, true
}

// stopping reports whether Config.Stop is closed.
func (p *Proxier) stopping() bool {
	select {
	case <-p.cfg.Stop:
		return true
	default:
		return false
	}
}

// ours reports which live virtual servers are steelyard's: those whose
// address is on the dummy interface or that are named in one of the entry
// sets (node ports are on the node's own addresses). Others (Docker
// swarm's, a hand-made one) are never touched. It also returns each entry's
// set comment, by set. sets, when not nil, holds the entry sets already
// read (List); otherwise they are read here.
func (p *Proxier) ours(sets map[string][]SetEntry) (func(VirtualServer) bool, map[dataplane.VIP]setComment, error) {
	entrySets := []string{SetVIPs, SetExternal, SetExternalLocal}
	if sets == nil {
		var err error
		if sets, err = p.sets.List(entrySets); err != nil {
			return nil, nil, err
		}
	}
	addrs, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return nil, nil, err
	}
	onLink := map[netip.Addr]bool{}
	for _, a := range addrs {
		onLink[a] = true
	}
	names := map[dataplane.VIP]setComment{}
	for _, set := range entrySets {
		for _, e := range sets[set] {
			if vip, ok := parseVIPMember(e.Member); ok {
				names[vip] = setComment{set: set, comment: e.Comment}
			}
		}
	}
	return func(v VirtualServer) bool {
		_, named := names[v.Key()]
		return onLink[v.Address] || named
	}, names, nil
}

// setComment is the set an entry is a member of, and its comment there.
type setComment struct {
	set     string
	comment string
}

// name returns the Service port's name from the comment.
func (c setComment) name() string {
	n, _ := parseComment(c.comment)
	return n
}

// readLive returns the live state of steelyard's virtual servers: all of
// them on a full Sync; on a partial one the remembered state, re-read only
// where the desired state changed or destinations drain.
//
// gone holds the virtual servers the canary found deleted behind our back:
// they are left out of live, so they are added again with every
// destination.
func (p *Proxier) readLive(want map[dataplane.VIP]*wantService, full bool, gone map[dataplane.VIP]bool, stats *SyncStats) (map[dataplane.VIP]*liveService, error) {
	live := map[dataplane.VIP]*liveService{}
	read := func(vs VirtualServer, name string) error {
		rss, err := p.ipvs.RealServers(vs)
		if err != nil {
			return err
		}
		ls := &liveService{vs: vs, name: name, dests: make(map[netip.AddrPort]RealServer, len(rss))}
		for _, r := range rss {
			ls.dests[r.Addr()] = r
		}
		live[vs.Key()] = ls
		stats.ServicesRead++
		return nil
	}
	if full {
		isOurs, names, err := p.ours(nil)
		if err != nil {
			return nil, err
		}
		vss, err := p.ipvs.VirtualServers()
		if err != nil {
			return nil, err
		}
		for _, vs := range vss {
			_, wanted := want[vs.Key()]
			if !wanted && !isOurs(vs) {
				continue
			}
			if err := read(vs, names[vs.Key()].name()); err != nil {
				return nil, err
			}
		}
		return live, nil
	}
	for vip, a := range p.applied {
		if gone[vip] {
			continue
		}
		w := want[vip]
		if w == nil || len(p.draining[vip]) > 0 || !p.unchanged(vip, a, w) {
			if err := read(a.vs, a.name); err != nil {
				return nil, err
			}
			live[vip].want = a.want
			continue
		}
		live[vip] = a
	}
	return live, nil
}

// unchanged reports whether the applied virtual server of vip was written
// from w itself (reused from the cache) or already equals it.
func (p *Proxier) unchanged(vip dataplane.VIP, a *liveService, w *wantService) bool {
	if p.appliedWant[vip] == w {
		return true
	}
	return a.matches(w)
}

// matches reports whether the applied service already is w (no draining).
func (a *liveService) matches(w *wantService) bool {
	if a.vs != w.vs || a.name != w.name || len(a.dests) != len(w.dests) || a.want == nil || a.want.meta != w.meta {
		return false
	}
	for addr, weight := range w.dests {
		d, ok := a.dests[addr]
		if !ok || d.Weight != weight {
			return false
		}
	}
	return true
}

// syncService reconciles one virtual server; it returns what the kernel
// holds afterwards and the number of destination writes.
func (p *Proxier) syncService(w *wantService, l *liveService, now time.Time) (*liveService, int, error) {
	vip := w.vs.Key()
	lg := log.WithFields(logrus.Fields{fieldVIP: vip.String(), fieldSvc: w.name})
	if l == nil {
		if err := p.ipvs.AddVirtualServer(w.vs); err != nil {
			return nil, 0, err
		}
		lg.WithField("scheduler", w.vs.Scheduler).Debug("added virtual server")
		l = &liveService{vs: w.vs, dests: map[netip.AddrPort]RealServer{}}
	} else if l.vs != w.vs {
		if err := p.ipvs.UpdateVirtualServer(w.vs); err != nil {
			return l, 0, err
		}
		lg.WithFields(logrus.Fields{"scheduler": w.vs.Scheduler, "persistence": w.vs.Persistence}).Debug("changed scheduler or persistence")
		l.vs = w.vs
	}
	l.name, l.want = w.name, w
	writes := 0
	var errs []error
	for _, addr := range w.order {
		weight := w.dests[addr]
		cur, ok := l.dests[addr]
		switch {
		case !ok:
			r := RealServer{Address: addr.Addr(), Port: addr.Port(), Weight: weight}
			if err := p.ipvs.AddRealServer(w.vs, r); err != nil {
				errs = append(errs, err)
				continue
			}
			l.dests[addr] = r
			writes++
			lg.WithFields(logrus.Fields{fieldBackend: addr.String(), fieldWeight: weight}).Debug("added destination")
		case cur.Weight != weight:
			cur.Weight = weight
			if err := p.ipvs.UpdateRealServer(w.vs, cur); err != nil {
				errs = append(errs, err)
				continue
			}
			l.dests[addr] = cur
			writes++
			lg.WithFields(logrus.Fields{fieldBackend: addr.String(), fieldWeight: weight}).Debug("changed weight")
		}
		if d := p.draining[vip]; d != nil {
			delete(d, addr) // back in the desired state: no longer draining
		}
	}
	n, derrs := p.drainGone(w, l, now, lg)
	writes += n
	errs = append(errs, derrs...)
	if d := p.draining[vip]; len(d) == 0 {
		delete(p.draining, vip)
	}
	return l, writes, errors.Join(errs...)
}
