package ebpf

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
	"github.com/steelyard-net/steelyard/dataplane/reconcile"
)

var log = logrus.WithField("subsys", "ebpf")

// Config is what the ebpf mode is constructed with.
type Config struct {
	// CgroupPath is the cgroup v2 directory the socket programs attach
	// to: its processes' and its descendants' sockets are balanced
	// (CheckCgroup).
	CgroupPath string
	// PinDir is the bpffs directory of the pinned maps and links
	// (DefaultPinDir when empty).
	PinDir string
	// NFTables configures the nftables dataplane that serves the entry
	// points no local socket starts.
	NFTables nftables.Config
	// CountConnections counts each endpoint's new connections: the socket
	// programs' choices in the counts map (counts.go), and the nftables
	// half's (NFTables.CountConnections, set with it).
	CountConnections bool
}

// kernel is the socket programs' state shared by both families: one set
// of maps holds IPv4 and IPv6 VIPs.
type kernel struct {
	cfg Config
	mu  sync.Mutex
	m   *maps // loaded and attached at the first Sync
	// read opens the maps for explain (false: none yet), and unload
	// removes everything; in memory for NewDualStackMem.
	read   func() (*maps, bool, error)
	unload func() error
}

// Proxier is one family of the ebpf mode: the nftables Proxier of the
// family plus that family's entries of the socket programs' maps.
type Proxier struct {
	family int
	nft    dataplane.Dataplane
	k      *kernel
	// eng runs the socket tables' Syncs (the reconcile engine).
	eng *reconcile.Engine
	// unloads is set on the IPv4 half: its Cleanup, which runs last,
	// detaches the programs and unpins the maps.
	unloads bool
	// byKey indexes the engine's record by VIP: the recorded ports of
	// each key, so a partial Sync finds the ports of the keys it writes
	// without a scan of every recorded port. Rebuilt by a full Sync; nil
	// after a failed one (the engine undid the record).
	byKey map[svcKey]map[dataplane.ServicePortName]bool
}

var _ dataplane.Dataplane = (*Proxier)(nil)

// NewDualStackKernel returns the ebpf mode over the running kernel. It
// writes nothing: the programs are loaded and attached at the first Sync.
func NewDualStackKernel(cfg Config) (*dataplane.DualStack, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if err := CheckCgroup(cfg.CgroupPath); err != nil {
		return nil, err
	}
	cfg.NFTables.CountConnections = cfg.CountConnections
	nft, err := nftables.NewDualStackKernel(cfg.NFTables)
	if err != nil {
		return nil, err
	}
	return newDualStack(nft, cfg), nil
}

func newDualStack(nft *dataplane.DualStack, cfg Config) *dataplane.DualStack {
	k := &kernel{cfg: cfg,
		read:   func() (*maps, bool, error) { return openPinned(cfg.PinDir) },
		unload: func() error { return unload(cfg.PinDir) },
	}
	return k.dualStack(nft)
}

// NewDualStackMem returns the ebpf mode over nft (nftables fakes) with its
// maps in memory (MemMap, MemCounters): for tests of what is written,
// without a kernel. counting is Config.CountConnections.
func NewDualStackMem(nft *dataplane.DualStack, counting bool) *dataplane.DualStack {
	m := memMapsFull()
	k := &kernel{m: m, cfg: Config{CountConnections: counting},
		read: func() (*maps, bool, error) { return m, true, nil },
		unload: func() error {
			*m = *memMapsFull()
			return nil
		},
	}
	return k.dualStack(nft)
}

// memMapsFull returns empty in-memory maps of the kernel's sizes.
func memMapsFull() *maps {
	return &maps{services: NewMemMap(svcKeySize, svcValSize, 65536), slots: NewMemMap(slotKeySize, backendSize, 1<<22),
		counts: NewMemCounters(2, 1<<20), names: NewMemMap(svcKeySize, nameSize, 65536), members: NewMemMap(countKeySize, 1, 1<<20)}
}

func (k *kernel) dualStack(nft *dataplane.DualStack) *dataplane.DualStack {
	v4 := &Proxier{family: 4, nft: nft.Family(4), k: k, eng: reconcile.New(), unloads: true}
	var v6 dataplane.Dataplane
	if nft.IPv6() {
		v6 = &Proxier{family: 6, nft: nft.Family(6), k: k, eng: reconcile.New()}
	}
	return dataplane.NewDualStack(v4, v6)
}

// Cleanup removes what the ebpf mode may have left under pinDir (the
// programs detached, the maps unpinned) and the nftables tables, without
// needing a cgroup: `steelyard cleanup --mode ebpf`.
func Cleanup(pinDir string, nft nftables.Config) error {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	d, err := nftables.NewDualStackKernel(nft)
	if err != nil {
		return err
	}
	return errors.Join(d.Cleanup(), unload(pinDir))
}

// Unload detaches the programs and unpins the maps of pinDir (default
// DefaultPinDir), leaving the nftables tables: a node switched to
// --mode nftables keeps them while the socket programs go.
func Unload(pinDir string) error {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	return unload(pinDir)
}

// maps returns the loaded maps, loading and attaching at the first call.
func (k *kernel) maps() (*maps, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m != nil {
		return k.m, nil
	}
	if err := CheckCgroup(k.cfg.CgroupPath); err != nil {
		return nil, err
	}
	t0 := time.Now()
	m, err := load(k.cfg.PinDir, k.cfg.CgroupPath, k.cfg.CountConnections)
	if err != nil {
		return nil, err
	}
	// took: loading (the verifier) and attaching (the kernel's cgroup
	// lock, shared with every cgroup change on the machine).
	log.WithFields(logrus.Fields{"cgroup": k.cfg.CgroupPath, "pins": k.cfg.PinDir, "took": time.Since(t0).Round(time.Millisecond)}).
		Info("socket programs attached")
	k.m = m
	return m, nil
}

// Sync implements dataplane.Dataplane: the family's socket tables first,
// on the reconcile engine (tableOps), then the nftables rules (they carry
// every entry point, the clusterIPs too, for sockets outside the cgroup).
// A full Sync (asked, or the engine's first or after a failure) compares
// every table with the maps and prunes the rest; a partial one compares
// and writes the VIPs of the Service ports that changed.
//
// Why the maps go first: the two halves serve disjoint traffic and read
// nothing of each other. A socket in the cgroup is rewritten to a pod at
// connect()/sendmsg(), so its packets never meet the nftables clusterIP
// rules; node ports, external and LB IPs, sockets outside the cgroup and
// connected UDP never meet the maps. So for the few milliseconds between
// the two writes each path serves either the old or the new state of the
// port on its own, as it would in the other order: a backend removed (or
// weighted 0, drained) is no longer chosen by the sockets while nftables
// may still choose it, where before nftables stopped first and the sockets
// still chose it; a port leaving the maps (a reject share, no internal
// backend) falls through to nftables, which may serve its old rules just
// as the old table would have. Within the maps the order that matters
// stays (syncMembers before the tables, each table switched in one
// update). The agent cleans conntrack after Sync returns, so after both.
// The order only decides which half waits: the sockets' write is a few map
// updates per changed port, the nftables half a render and a netlink
// transaction that grow with the cluster, so the maps no longer wait for
// it (issue 22: change -> map latency). A failed map write does not stop
// the nftables half (the other entry points still get the change); both
// errors are returned and the next Sync is full.
func (p *Proxier) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	if nftFirst {
		return p.syncNFTFirst(s, req)
	}
	r, mapErr := p.syncMaps(s, req)
	res, err := p.nft.Sync(s, req)
	if err := errors.Join(mapErr, err); err != nil {
		return res, err
	}
	res.Full = res.Full || r.Full
	return res, nil
}

// nftFirst restores the order before the maps went first (nftables half,
// then the maps, full when the nftables half was): only the benchmark
// that measures the difference sets it (BenchmarkChangeToMap).
var nftFirst bool

func (p *Proxier) syncNFTFirst(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	res, err := p.nft.Sync(s, req)
	if err != nil {
		return res, err
	}
	r, err := p.syncMaps(s, dataplane.SyncRequest{Full: res.Full, Changed: req.Changed})
	if err != nil {
		return res, err
	}
	res.Full = res.Full || r.Full
	return res, nil
}

// syncMaps writes the family's socket tables (the reconcile engine).
func (p *Proxier) syncMaps(s dataplane.State, req dataplane.SyncRequest) (reconcile.Result, error) {
	ops := &tableOps{p: p}
	r, err := p.eng.Sync(s, req, ops)
	if err != nil {
		p.byKey = nil // the engine undid the record: rebuilt at the next (full) Sync
		return r, err
	}
	if ops.changed > 0 {
		log.WithField("family", p.family).WithField("ports", ops.changed).Debug("socket tables written")
	}
	return r, nil
}

// tableOps are the socket tables' operations of one Sync
// (reconcile.Ops): Update and Delete collect the VIPs to compare, Commit
// writes them. Each table switches atomically (syncTables), so a failed
// Sync leaves every VIP on a complete table; the engine then makes the
// next Sync full, which compares every table with the maps.
type tableOps struct {
	p       *Proxier
	full    bool
	applied map[dataplane.ServicePortName]*dataplane.ServicePort
	// only are the VIPs a partial Sync compares; touched the ports
	// updated or deleted, with their recorded value before (for byKey).
	only    map[svcKey]bool
	touched []touchedPort
	changed int
}

type touchedPort struct {
	n   dataplane.ServicePortName
	old *dataplane.ServicePort
}

var _ reconcile.Ops = (*tableOps)(nil)

// Wants implements reconcile.Ops: the family's ports the socket programs
// serve.
func (o *tableOps) Wants(sp *dataplane.ServicePort) bool {
	return sp.Family() == o.p.family && socketServed(sp)
}

// Intact implements reconcile.Ops: the maps are held open (pinned) from
// the first Sync on; the nftables half finds its table flushed.
func (o *tableOps) Intact() bool { return true }

// Begin implements reconcile.Ops.
func (o *tableOps) Begin(full bool, applied map[dataplane.ServicePortName]*dataplane.ServicePort) (reconcile.Plan, error) {
	o.full, o.applied, o.only = full, applied, map[svcKey]bool{}
	return reconcile.Plan{}, nil
}

// Update implements reconcile.Ops.
func (o *tableOps) Update(n dataplane.ServicePortName, old, sp *dataplane.ServicePort) *dataplane.ServicePort {
	o.touched = append(o.touched, touchedPort{n, old})
	o.touch(old)
	o.touch(sp)
	// A copy: the record must stay what was written when the agent
	// reuses the State.
	return sp.Clone()
}

// Delete implements reconcile.Ops.
func (o *tableOps) Delete(n dataplane.ServicePortName, old *dataplane.ServicePort) {
	o.touched = append(o.touched, touchedPort{n, old})
	o.touch(old)
}

func (o *tableOps) touch(sp *dataplane.ServicePort) {
	if sp == nil {
		return
	}
	if key, ok := svcKeyOf(sp.VIP); ok {
		o.only[key] = true
	}
}

// Prune implements reconcile.Ops: a full Sync compares every VIP (Commit).
func (o *tableOps) Prune(map[dataplane.ServicePortName]*dataplane.ServicePort) {}

// Commit implements reconcile.Ops: the counters, the affinity members and
// the tables of the VIPs to compare (all of them in a full Sync), as the
// record now says.
func (o *tableOps) Commit(bool) error {
	var only map[svcKey]bool
	if !o.full {
		if len(o.only) == 0 {
			return nil
		}
		only = o.only
	}
	m, err := o.p.k.maps()
	if err != nil {
		return err
	}
	var old map[svcKey]table
	if only != nil && o.p.byKey != nil {
		old = o.oldWant(only)
	}
	o.index()
	want := o.want(only)
	cs, err := prepareCounts(m, want, o.p.family, o.p.k.cfg.CountConnections, only, old)
	if err != nil {
		return fmt.Errorf("socket counters: %w", err)
	}
	if err := syncMembers(m, want, o.p.family, only, old); err != nil {
		return fmt.Errorf("socket affinity: %w", err)
	}
	o.changed, err = syncTables(m, want, o.p.family, only)
	if err != nil {
		return fmt.Errorf("socket tables: %w", err)
	}
	if err := cs.prune(); err != nil {
		return fmt.Errorf("socket counters: %w", err)
	}
	return nil
}

// index brings the Proxier's byKey up to the record as this Sync left it:
// rebuilt from every recorded port in a full Sync (or when there is none),
// else moved for the ports this Sync touched only.
func (o *tableOps) index() {
	p := o.p
	if o.full || p.byKey == nil {
		p.byKey = map[svcKey]map[dataplane.ServicePortName]bool{}
		for n, sp := range o.applied {
			p.indexAdd(n, sp)
		}
		return
	}
	for _, t := range o.touched {
		if t.old != nil {
			if key, ok := svcKeyOf(t.old.VIP); ok {
				delete(p.byKey[key], t.n)
				if len(p.byKey[key]) == 0 {
					delete(p.byKey, key)
				}
			}
		}
		if sp := o.applied[t.n]; sp != nil {
			p.indexAdd(t.n, sp)
		}
	}
}

func (p *Proxier) indexAdd(n dataplane.ServicePortName, sp *dataplane.ServicePort) {
	key, ok := svcKeyOf(sp.VIP)
	if !ok {
		return
	}
	if p.byKey[key] == nil {
		p.byKey[key] = map[dataplane.ServicePortName]bool{}
	}
	p.byKey[key][n] = true
}

// oldWant returns what the last Sync wanted for the VIPs of only (want
// before this Sync's changes): the ports byKey still lists under them, at
// their value before this Sync touched them. Called before index moves
// byKey on.
func (o *tableOps) oldWant(only map[svcKey]bool) map[svcKey]table {
	before := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	for _, t := range o.touched {
		if _, seen := before[t.n]; !seen {
			before[t.n] = t.old
		}
	}
	return tablesOf(o.namesAt(only), func(n dataplane.ServicePortName) *dataplane.ServicePort {
		if sp, ok := before[n]; ok {
			return sp
		}
		return o.applied[n]
	})
}

// want returns the tables of the recorded ports whose VIP is in only (nil:
// all), found through byKey. Two ports with one VIP: the last by name
// wins, as in desiredTables over a sorted State.
func (o *tableOps) want(only map[svcKey]bool) map[svcKey]table {
	var names []dataplane.ServicePortName
	if only == nil {
		names = make([]dataplane.ServicePortName, 0, len(o.applied))
		for n := range o.applied {
			names = append(names, n)
		}
	} else {
		names = o.namesAt(only)
	}
	return tablesOf(names, func(n dataplane.ServicePortName) *dataplane.ServicePort { return o.applied[n] })
}

// namesAt returns the recorded port names whose VIP is in only.
func (o *tableOps) namesAt(only map[svcKey]bool) []dataplane.ServicePortName {
	var names []dataplane.ServicePortName
	for key := range only {
		for n := range o.p.byKey[key] {
			names = append(names, n)
		}
	}
	return names
}

// tablesOf returns the tables of names' ports as port looks them up,
// taken in name order so that of two ports with one VIP the last by name
// wins, as in desiredTables over a sorted State. Ports port does not know,
// and VIPs the maps do not hold, are left out.
func tablesOf(names []dataplane.ServicePortName, port func(dataplane.ServicePortName) *dataplane.ServicePort) map[svcKey]table {
	slices.SortFunc(names, func(a, b dataplane.ServicePortName) int { return strings.Compare(a.String(), b.String()) })
	out := make(map[svcKey]table, len(names))
	for _, n := range names {
		sp := port(n)
		if sp == nil {
			continue
		}
		if _, ok := svcKeyOf(sp.VIP); !ok {
			continue
		}
		t := tableOf(sp)
		out[t.key] = t
	}
	return out
}

// Done implements reconcile.Ops.
func (o *tableOps) Done(bool) {}

// Counts implements dataplane.Dataplane: the nftables half's counts (node
// ports, external IPs, sockets outside the cgroup, connected UDP) plus
// the socket programs' of the family's VIPs, summed per endpoint: one
// endpoint's connections through every path in one count.
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	nft, err := p.nft.Counts()
	if err != nil {
		return nil, err
	}
	m, ok, err := p.k.read()
	if err != nil || !ok {
		return nft, err
	}
	if m != p.k.m {
		defer m.Close()
	}
	sock, err := socketCounts(m, p.family)
	if err != nil {
		return nil, err
	}
	return dataplane.MergeCounts(nft, sock), nil
}

// Explain implements dataplane.Dataplane: the nftables views, with the
// clusterIP shares of every VIP the socket programs serve taken from the
// slot table the kernel holds (a socket in the cgroup never reaches the
// nftables clusterIP rules).
func (p *Proxier) Explain() ([]dataplane.ServiceView, error) {
	views, err := p.nft.Explain()
	if err != nil {
		return nil, err
	}
	m, ok, err := p.k.read()
	if err != nil || !ok {
		return views, err
	}
	if m != p.k.m {
		defer m.Close()
	}
	live, _, _, err := liveTables(m)
	if err != nil {
		return nil, err
	}
	return mergeViews(views, live, p.family), nil
}

// Cleanup implements dataplane.Dataplane.
func (p *Proxier) Cleanup() error {
	// The tables go with the maps: the next Sync writes every one.
	p.eng.Reset()
	p.byKey = nil
	err := p.nft.Cleanup()
	if !p.unloads {
		return err
	}
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	if p.k.m != nil && p.k.cfg.PinDir != "" {
		p.k.m.Close()
		p.k.m = nil
	}
	return errors.Join(err, p.k.unload())
}

// mergeViews replaces the backends of the clusterIP views that live has a
// table for (of the family) with the table's shares.
func mergeViews(views []dataplane.ServiceView, live map[svcKey]table, family int) []dataplane.ServiceView {
	seen := map[svcKey]bool{}
	for i := range views {
		v := &views[i]
		if v.Entry != "" && v.Entry != dataplane.EntryClusterIP {
			continue
		}
		ip, err := netip.ParseAddr(v.VIP)
		if err != nil {
			continue
		}
		key, ok := svcKeyOf(dataplane.VIP{IP: ip, Port: v.Port, Protocol: v.Protocol})
		if !ok {
			continue
		}
		t, ok := live[key]
		if !ok {
			continue
		}
		seen[key] = true
		applyTable(v, t)
	}
	for key, t := range live {
		if seen[key] || familyOf(key.Addr) != family {
			continue
		}
		v := dataplane.ServiceView{VIP: key.Addr.String(), Port: key.Port, Protocol: key.protocol(), Entry: dataplane.EntryClusterIP}
		applyTable(&v, t)
		v.Problems = append(v.Problems, "a socket table for a VIP the nftables rules do not know")
		views = append(views, v)
	}
	dataplane.SortViews(views)
	return views
}

// applyTable sets v's backends to the shares of t's slots.
func applyTable(v *dataplane.ServiceView, t table) {
	counts := map[netip.AddrPort]int{}
	missing := 0
	for _, s := range t.slots {
		if !s.Addr.IsValid() || s.Addr.IsUnspecified() {
			missing++
			continue
		}
		counts[s.addrPort()]++
	}
	v.Backends = []dataplane.BackendView{}
	v.Reject, v.Drop = false, false
	v.AffinitySeconds = int(t.affinity)
	for ap, c := range counts {
		v.Backends = append(v.Backends, dataplane.BackendView{IP: ap.Addr().String(), Port: ap.Port(),
			Share: dataplane.RoundShare(100 * float64(c) / float64(len(t.slots)))})
	}
	if len(t.slots) == MaxSlots {
		// Fill's largest-remainder table: within one slot of the weights.
		v.ShareBound = 100.0 / MaxSlots
	}
	if missing > 0 {
		v.Problems = append(v.Problems, fmt.Sprintf("%d of %d slots missing from the table", missing, len(t.slots)))
	}
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// NewDualStackReader returns the ebpf mode for explain and verify: it
// reads the pinned maps and the nftables rules and needs no cgroup. Its
// Sync fails.
func NewDualStackReader(cfg Config) (*dataplane.DualStack, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	nft, err := nftables.NewDualStackKernel(cfg.NFTables)
	if err != nil {
		return nil, err
	}
	return newDualStack(nft, cfg), nil
}
