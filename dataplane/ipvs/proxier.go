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
	"github.com/steelyard-net/steelyard/dataplane/iptables"
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

// DefaultGracefulPeriod bounds how long a leaving destination drains.
const DefaultGracefulPeriod = 30 * time.Second

// drainCheckInterval is how soon after a Sync that left destinations
// draining the proxier asks for another Sync (SyncResult.RequeueAfter).
const drainCheckInterval = time.Second

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
}

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
	// applied is what the last successful Sync left in the kernel, per VIP;
	// nil forces a full Sync (at start and after a failure).
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
		sets: familySets{sets, cfg.Family}, ipt: ipt, cfg: cfg,
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

// cachedWant is the wantServices built from a ServicePort, so the next Sync
// reuses them while the ServicePort is unchanged (most of them, most times).
type cachedWant struct {
	sp dataplane.ServicePort
	ws []*wantService
}

// wantService is one virtual server (one entry point of a Service port) as
// the desired state has it.
type wantService struct {
	vs    VirtualServer
	name  string
	meta  entryMeta
	dests map[netip.AddrPort]int
	// order is the destinations sorted, for deterministic writes.
	order []netip.AddrPort
}

// entryMeta is what an entry point is, beyond its destinations: which sets
// it belongs to, hence what the rules do with its traffic.
type entryMeta struct {
	// entry is dataplane.EntryClusterIP, EntryNodePort, EntryExternalIP or
	// EntryLoadBalancer.
	entry string
	// local is the Local traffic policy (the internal one for the
	// clusterIP, the external one for the others).
	local bool
	// drop: the policy leaves no endpoint while others exist; new
	// connections are dropped (SetDrop), as in the iptables mode.
	drop bool
	// ranges are loadBalancerSourceRanges, comma-separated, in order.
	ranges string
}

// onDummy reports whether the entry's address belongs on the dummy
// interface: every one but node ports, which use the node's own addresses.
func (m entryMeta) onDummy() bool { return m.entry != dataplane.EntryNodePort }

// comment is the entry's member comment in SetVIPs, SetExternal or
// SetExternalLocal: the Service port's name, and what explain cannot read
// from the set the member is in. No spaces: ipset restore splits on them.
func (m entryMeta) comment(name string) string {
	switch {
	case m.entry != dataplane.EntryClusterIP:
		return name + "|" + m.entry
	case m.local:
		return name + "|" + dataplane.PolicyLocal
	}
	return name
}

// parseComment reads a comment back: the name, and the entry kind or
// policy after "|".
func parseComment(c string) (name, extra string) {
	name, extra, _ = strings.Cut(c, "|")
	return name, extra
}

// desired turns the State into virtual servers with integer weights: per
// Service port, the clusterIP, each node address with the node port, each
// external and load-balancer IP. Every backend is a destination of each of
// them; those the entry's policy (or topology) leaves out have weight 0, so
// their established connections drain instead of breaking.
func (p *Proxier) desired(s dataplane.State, nodeAddrs []netip.Addr, req dataplane.SyncRequest) map[dataplane.VIP]*wantService {
	out := make(map[dataplane.VIP]*wantService, len(s.Services))
	if !slices.Equal(nodeAddrs, p.cacheNodeAddrs) {
		p.wantCache, p.cacheNodeAddrs = nil, slices.Clone(nodeAddrs)
	}
	next := make(map[dataplane.VIP]*cachedWant, len(s.Services))
	skipped := 0
	put := func(w *wantService) {
		if o := out[w.vs.Key()]; o != nil {
			// Two Services claim one address and port (an external IP
			// twice, a node address that is also an external IP): the
			// first in name order keeps it, as kube-proxy's last-write
			// would be arbitrary.
			log.WithFields(logrus.Fields{fieldVIP: w.vs.Key().String(), fieldSvc: w.name, "owner": o.name}).Warn("entry point already used by another Service port; skipped")
			return
		}
		out[w.vs.Key()] = w
	}
	for i := range s.Services {
		sp := &s.Services[i]
		if !p.cfg.is(sp.VIP.IP) {
			// The other family's Proxier programs it (DualStack).
			skipped++
			continue
		}
		// The tracker saw its Service unchanged, or it equals the cached
		// one (the name too: another Service may have taken the VIP).
		if c := p.wantCache[sp.VIP]; c != nil && c.sp.Name == sp.Name && (!req.MayHaveChanged(sp.Name) || c.sp.Equal(sp)) {
			for _, w := range c.ws {
				put(w)
			}
			next[sp.VIP] = c
			continue
		}
		c := &cachedWant{sp: *sp, ws: p.entries(sp, nodeAddrs)}
		c.sp.Backends = slices.Clone(sp.Backends)
		c.sp.ExternalIPs = slices.Clone(sp.ExternalIPs)
		c.sp.LoadBalancerIPs = slices.Clone(sp.LoadBalancerIPs)
		c.sp.SourceRanges = slices.Clone(sp.SourceRanges)
		for _, w := range c.ws {
			put(w)
		}
		next[sp.VIP] = c
	}
	p.wantCache = next
	if skipped > 0 && !p.warnedFamily {
		log.WithFields(logrus.Fields{"ports": skipped, "family": p.cfg.Family}).Info("Service ports of the other IP family left out: this Proxier programs one family")
		p.warnedFamily = true
	}
	return out
}

// entries returns the virtual servers of one Service port.
func (p *Proxier) entries(sp *dataplane.ServicePort, nodeAddrs []netip.Addr) []*wantService {
	sched := sp.Scheduler
	if sched == "" {
		sched = p.cfg.Scheduler
	}
	name := sp.Name.String()
	none := len(sp.Active()) == 0
	// weights gives every backend its weight among bs, 0 for the others.
	weights := func(bs []dataplane.Backend) (map[netip.AddrPort]int, []netip.AddrPort) {
		in := map[netip.AddrPort]bool{}
		for _, b := range bs {
			in[b.Addr()] = true
		}
		fs := make([]float64, len(sp.Backends))
		for j, b := range sp.Backends {
			if in[b.Addr()] {
				fs[j] = b.Weight
			}
		}
		dests := make(map[netip.AddrPort]int, len(sp.Backends))
		var order []netip.AddrPort
		for j, iw := range IntWeights(fs) {
			a := sp.Backends[j].Addr()
			if _, dup := dests[a]; !dup {
				order = append(order, a)
			}
			dests[a] += iw
		}
		slices.SortFunc(order, netip.AddrPort.Compare)
		return dests, order
	}
	mk := func(ip netip.Addr, port uint16, meta entryMeta, dests map[netip.AddrPort]int, order []netip.AddrPort) *wantService {
		return &wantService{
			vs: VirtualServer{Address: ip, Port: port, Protocol: sp.VIP.Protocol, Scheduler: sched,
				Persistence: uint32(max(0, sp.AffinitySeconds))},
			name: name, meta: meta, dests: dests, order: order,
		}
	}
	internal := sp.InternalBackends()
	idests, iorder := weights(internal)
	ws := []*wantService{mk(sp.VIP.IP, sp.VIP.Port, entryMeta{entry: dataplane.EntryClusterIP, local: sp.InternalLocal,
		drop: len(internal) == 0 && !none}, idests, iorder)}
	if !sp.HasExternal() {
		return ws
	}
	// The external entry points share one set of destinations (read-only).
	external := sp.ExternalBackends()
	edests, eorder := weights(external)
	ext := entryMeta{local: sp.ExternalLocal, drop: len(external) == 0 && !none}
	if sp.NodePort != 0 {
		m := ext
		m.entry = dataplane.EntryNodePort
		for _, a := range nodeAddrs {
			ws = append(ws, mk(a, sp.NodePort, m, edests, eorder))
		}
	}
	for _, ip := range sp.ExternalIPs {
		m := ext
		m.entry = dataplane.EntryExternalIP
		ws = append(ws, mk(ip, sp.VIP.Port, m, edests, eorder))
	}
	var ranges []string
	for _, r := range sp.SourceRanges {
		if p.cfg.is(r.Addr()) {
			ranges = append(ranges, r.String())
		}
	}
	for _, ip := range sp.LoadBalancerIPs {
		m := ext
		m.entry, m.ranges = dataplane.EntryLoadBalancer, strings.Join(ranges, ",")
		ws = append(ws, mk(ip, sp.VIP.Port, m, edests, eorder))
	}
	return ws
}

// nodeAddresses returns the addresses of the Proxier's family (not
// link-local: a node port there would need a zone) node ports are open on: those
// of Config.NodeAddresses that are not on the dummy interface (a node
// address list taken from every interface includes the VIPs there) and are
// not a desired clusterIP, external or load-balancer IP.
func (p *Proxier) nodeAddresses(s dataplane.State) ([]netip.Addr, error) {
	if p.cfg.NodeAddresses == nil {
		return nil, nil
	}
	all := p.cfg.NodeAddresses()
	if len(all) == 0 {
		return nil, nil
	}
	skip := map[netip.Addr]bool{}
	onLink, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return nil, err
	}
	for _, a := range onLink {
		skip[a] = true
	}
	for i := range s.Services {
		sp := &s.Services[i]
		skip[sp.VIP.IP] = true
		for _, a := range sp.ExternalIPs {
			skip[a] = true
		}
		for _, a := range sp.LoadBalancerIPs {
			skip[a] = true
		}
	}
	var out []netip.Addr
	for _, a := range all {
		a = a.Unmap()
		if p.cfg.is(a) && !a.IsLinkLocalUnicast() && !a.IsLoopback() && !skip[a] && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out, nil
}

// Sync reconciles the kernel with s by difference. A full Sync reads the
// whole live IPVS table (steelyard's part of it), the dummy interface and the
// sets, and re-ensures sysctls and rules; a partial one reads back only the
// virtual servers whose desired state changed or that have draining
// destinations. Unlike iptables-restore, IPVS has no transaction: a failed
// write is reported, the rest still applied, and the next Sync is full.
// While destinations drain, the result asks for another Sync soon, so they
// are deleted shortly after their last connection ends.
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	if err := p.sync(s, req); err != nil {
		return dataplane.SyncResult{}, err
	}
	res := dataplane.SyncResult{Full: p.LastSync.Full}
	if p.LastSync.Draining > 0 {
		res.RequeueAfter = drainCheckInterval
	}
	return res, nil
}

func (p *Proxier) sync(s dataplane.State, req dataplane.SyncRequest) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.cfg.Now()
	nodeAddrs, err := p.nodeAddresses(s)
	if err != nil {
		return err
	}
	full := req.Full
	if p.applied == nil || !p.ready {
		full = true
	}
	req.Full = full
	want := p.desired(s, nodeAddrs, req)
	canaryMissing := false
	if !full && !p.canary() {
		// Someone flushed the table or removed the interface: repair all.
		full, canaryMissing = true, true
	}
	stats := SyncStats{Full: full, CanaryMissing: canaryMissing, Services: len(want)}
	if full {
		if err := p.setup(); err != nil {
			p.applied, p.ready = nil, false
			return err
		}
	}
	live, err := p.readLive(want, full, &stats)
	if err != nil {
		p.applied = nil
		return err
	}

	var errs []error
	// Sets first: the masquerade rules must know a VIP before its first
	// packet is forwarded.
	if err := p.syncSets(want, full); err != nil {
		errs = append(errs, err)
	}
	if err := p.syncAddresses(want, live, full); err != nil {
		errs = append(errs, err)
	}
	now := p.cfg.Now()
	applied := make(map[dataplane.VIP]*liveService, len(want))
	for _, vip := range sortedVIPs(want) {
		w := want[vip]
		l := live[vip]
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
	stats.Took = p.cfg.Now().Sub(start)
	p.LastSync = stats
	return nil
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

// canary reports whether everything the last Sync applied is still there
// at the coarse level a flush or a deleted interface would break: every
// virtual server (one netlink dump) and every VIP on the interface. It
// does not read destinations; full Syncs (--full-sync-period) repair those.
func (p *Proxier) canary() bool {
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return false
	}
	live := make(map[dataplane.VIP]bool, len(vss))
	for _, vs := range vss {
		live[vs.Key()] = true
	}
	addrs, err := p.links.Addresses(p.cfg.Interface)
	if err != nil {
		return false
	}
	onLink := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		onLink[a] = true
	}
	for vip, a := range p.applied {
		if !live[vip] || (a.want != nil && a.want.meta.onDummy() && !onLink[vip.IP]) {
			log.WithField(fieldVIP, vip.String()).Info("applied virtual server or VIP gone from the kernel; running a full sync")
			return false
		}
	}
	return true
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
func (p *Proxier) readLive(want map[dataplane.VIP]*wantService, full bool, stats *SyncStats) (map[dataplane.VIP]*liveService, error) {
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
	// Destinations that left: drain at weight 0, delete when idle or late.
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
	if d := p.draining[vip]; len(d) == 0 {
		delete(p.draining, vip)
	}
	return l, writes, errors.Join(errs...)
}

func sortedAddrs[T any](m map[netip.AddrPort]T) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

// syncAddresses puts every desired VIP on the dummy interface. On a partial
// Sync only VIPs new since the last one are added.
func (p *Proxier) syncAddresses(want map[dataplane.VIP]*wantService, live map[dataplane.VIP]*liveService, full bool) error {
	have := map[netip.Addr]bool{}
	if full {
		addrs, err := p.links.Addresses(p.cfg.Interface)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			have[a] = true
		}
	} else {
		for vip, a := range p.applied {
			if a.want != nil && a.want.meta.onDummy() {
				have[vip.IP] = true
			}
		}
	}
	for _, vip := range sortedVIPs(want) {
		if have[vip.IP] || !want[vip].meta.onDummy() {
			continue
		}
		if err := p.links.AddAddress(p.cfg.Interface, vip.IP); err != nil {
			return err
		}
		have[vip.IP] = true
	}
	return nil
}

// removeStaleAddresses removes from the dummy interface the VIPs that no
// desired Service uses any more.
func (p *Proxier) removeStaleAddresses(want map[dataplane.VIP]*wantService, full bool) error {
	wanted := map[netip.Addr]bool{}
	for vip, w := range want {
		if w.meta.onDummy() {
			wanted[vip.IP] = true
		}
	}
	var candidates []netip.Addr
	if full {
		addrs, err := p.links.Addresses(p.cfg.Interface)
		if err != nil {
			return err
		}
		candidates = addrs
	} else {
		for vip, a := range p.applied {
			if a.want == nil || a.want.meta.onDummy() {
				candidates = append(candidates, vip.IP)
			}
		}
	}
	for _, a := range candidates {
		if wanted[a] {
			continue
		}
		if err := p.links.DelAddress(p.cfg.Interface, a); err != nil {
			return err
		}
	}
	return nil
}

// vipMember is the SetVIPs member of a VIP: "198.18.0.10,tcp:80".
func vipMember(v dataplane.VIP) string {
	return fmt.Sprintf("%s,%s:%d", v.IP, v.Protocol.Lower(), v.Port)
}

// parseVIPMember reads a SetVIPs member back.
func parseVIPMember(m string) (dataplane.VIP, bool) {
	ipS, rest, ok := strings.Cut(m, ",")
	if !ok {
		return dataplane.VIP{}, false
	}
	protoS, portS, ok := strings.Cut(rest, ":")
	if !ok {
		return dataplane.VIP{}, false
	}
	ip, err := netip.ParseAddr(ipS)
	if err != nil {
		return dataplane.VIP{}, false
	}
	var port uint16
	if _, err := fmt.Sscanf(portS, "%d", &port); err != nil {
		return dataplane.VIP{}, false
	}
	return dataplane.VIP{IP: ip, Port: port, Protocol: dataplane.Protocol(strings.ToUpper(protoS))}, true
}

// loopMember is the SetLoopback member of a destination of vip.
func loopMember(vip dataplane.VIP, d netip.AddrPort) string {
	return fmt.Sprintf("%s,%s:%d,%s", d.Addr(), vip.Protocol.Lower(), d.Port(), d.Addr())
}

// members returns the set members of an entry point, by set, with their
// comments; the loopback members (per destination) are left to the caller.
func (w *wantService) members() map[string]map[string]string {
	vip := w.vs.Key()
	m := vipMember(vip)
	out := map[string]map[string]string{}
	add := func(set, member, comment string) {
		if out[set] == nil {
			out[set] = map[string]string{}
		}
		out[set][member] = comment
	}
	switch {
	case w.meta.entry == dataplane.EntryClusterIP:
		add(SetVIPs, m, w.meta.comment(w.name))
	case w.meta.local:
		add(SetExternalLocal, m, w.meta.comment(w.name))
	default:
		add(SetExternal, m, w.meta.comment(w.name))
	}
	if w.meta.drop {
		add(SetDrop, m, "")
	}
	if w.meta.ranges != "" {
		add(SetFirewall, m, "")
		for i, r := range strings.Split(w.meta.ranges, ",") {
			// The comment keeps the range's position: explain shows them
			// in the Service's order.
			add(SetSourceRanges, m+","+r, fmt.Sprint(i))
		}
	}
	return out
}

// syncSets makes the sets hold exactly the desired members, in one ipset
// restore. Draining destinations keep their loopback member.
func (p *Proxier) syncSets(want map[dataplane.VIP]*wantService, full bool) error {
	wantM, haveM := map[string]map[string]string{}, map[string]map[string]string{}
	for _, st := range setTypes {
		wantM[st.name], haveM[st.name] = map[string]string{}, map[string]string{}
	}
	addWant := func(vip dataplane.VIP, w *wantService) {
		for set, ms := range w.members() {
			for m, c := range ms {
				wantM[set][m] = c
			}
		}
		for addr := range w.dests {
			wantM[SetLoopback][loopMember(vip, addr)] = ""
		}
		for addr := range p.draining[vip] {
			wantM[SetLoopback][loopMember(vip, addr)] = ""
		}
	}
	addHave := func(vip dataplane.VIP, a *liveService) {
		if a.want != nil {
			for set, ms := range a.want.members() {
				for m, c := range ms {
					haveM[set][m] = c
				}
			}
		}
		for addr := range a.dests {
			haveM[SetLoopback][loopMember(vip, addr)] = ""
		}
	}
	if full {
		for vip, w := range want {
			addWant(vip, w)
		}
		all, err := p.sets.List(setNames())
		if err != nil {
			return err
		}
		for _, st := range setTypes {
			for _, e := range all[st.name] {
				haveM[st.name][e.Member] = e.Comment
			}
		}
	} else {
		// Only the Services that changed since the last Sync.
		for vip, w := range want {
			a := p.applied[vip]
			if a != nil && len(p.draining[vip]) == 0 && p.unchanged(vip, a, w) {
				continue
			}
			addWant(vip, w)
			if a != nil {
				addHave(vip, a)
			}
		}
		for vip, a := range p.applied {
			if want[vip] == nil {
				addHave(vip, a)
			}
		}
		// A loopback member is per destination, and a destination can
		// serve several entry points (a node port and its clusterIP, two
		// Services over one pod port): keep the members that an entry
		// this partial Sync did not look at still needs.
		var gone []string
		for m := range haveM[SetLoopback] {
			if _, ok := wantM[SetLoopback][m]; !ok {
				gone = append(gone, m)
			}
		}
		if len(gone) > 0 {
			needed := map[string]bool{}
			for vip, w := range want {
				for addr := range w.dests {
					needed[loopMember(vip, addr)] = true
				}
			}
			for _, m := range gone {
				if needed[m] {
					wantM[SetLoopback][m] = ""
				}
			}
		}
	}
	var b strings.Builder
	for _, st := range setTypes {
		diffSet(&b, st.name, wantM[st.name], haveM[st.name], st.comments)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := p.sets.Restore(b.String()); err != nil {
		return fmt.Errorf("update ipsets: %w", err)
	}
	return nil
}

func diffSet(b *strings.Builder, set string, want, have map[string]string, comments bool) {
	for _, m := range sortedKeys(have) {
		if c, ok := want[m]; !ok || (comments && c != have[m]) {
			fmt.Fprintf(b, "del %s %s\n", set, m)
		}
	}
	for _, m := range sortedKeys(want) {
		if c, ok := have[m]; ok && (!comments || c == want[m]) {
			continue
		}
		if comments {
			fmt.Fprintf(b, "add %s %s comment %q\n", set, m, want[m])
		} else {
			fmt.Fprintf(b, "add %s %s\n", set, m)
		}
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
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
