package ipvs

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/internal/iptables"
)

// Test IP plan: VIPs in 198.18.0.0/16, pods in 198.19.0.0/16.

type testKernel struct {
	p     *Proxier
	ipvs  *Fake
	links *FakeLinks
	sets  *FakeSets
	ipt   *iptables.Fake
	now   time.Time
	cfg   Config
}

func sysctlDir(t testing.TB) string {
	dir := t.TempDir()
	for _, sc := range Sysctls {
		path := filepath.Join(dir, strings.ReplaceAll(sc.Name, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newTestKernel(t testing.TB) *testKernel {
	k := &testKernel{ipvs: NewFake(), links: NewFakeLinks(), sets: NewFakeSets(), ipt: iptables.NewFake(),
		now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	k.sets.Referenced = func(name string) bool {
		saved, _ := k.ipt.SaveAll()
		return strings.Contains(string(saved), name)
	}
	k.cfg = Config{Now: func() time.Time { return k.now }, SysctlDir: sysctlDir(t),
		Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}}}
	k.p = NewProxier(k.ipvs, k.links, k.sets, k.ipt, k.cfg)
	return k
}

// restart returns a new Proxier over the same kernel: no memory.
func (k *testKernel) restart() { k.p = NewProxier(k.ipvs, k.links, k.sets, k.ipt, k.cfg) }

func (k *testKernel) sync(t testing.TB, s dataplane.State, full bool) {
	t.Helper()
	if _, err := k.p.Sync(s, dataplane.SyncRequest{Full: full}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func svc(name, vip string, port uint16, proto dataplane.Protocol, backends ...dataplane.Backend) dataplane.ServicePort {
	return dataplane.ServicePort{
		Name:     dataplane.ServicePortName{Namespace: "demo", Name: name, Port: "p"},
		VIP:      dataplane.VIP{IP: netip.MustParseAddr(vip), Port: port, Protocol: proto},
		Backends: backends,
	}
}

func be(addr string, w float64) dataplane.Backend {
	ap := netip.MustParseAddrPort(addr)
	return dataplane.Backend{IP: ap.Addr(), Port: ap.Port(), Weight: w, Ready: w > 0, Serving: w > 0}
}

func state(sps ...dataplane.ServicePort) dataplane.State {
	s := dataplane.State{Services: sps}
	s.Sort()
	return s
}

func vipOf(s string, proto dataplane.Protocol) dataplane.VIP {
	ap := netip.MustParseAddrPort(s)
	return dataplane.VIP{IP: ap.Addr(), Port: ap.Port(), Protocol: proto}
}

func checkDump(t *testing.T, k *testKernel, want string) {
	t.Helper()
	if got := k.ipvs.Dump(); got != want {
		t.Fatalf("IPVS table:\n%s\nwant:\n%s", got, want)
	}
}

func TestSyncAddsUpdatesDeletesByDifference(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	dns := svc("dns", "198.18.0.53", 53, dataplane.UDP, be("198.19.1.3:5353", 1), be("198.19.2.3:5353", 2), be("198.19.3.3:5353", 3), be("198.19.4.3:5353", 4))
	k.sync(t, state(web, dns), true)
	checkDump(t, k, `TCP 198.18.0.10:80 wrr
  -> 198.19.1.2:8080 10
  -> 198.19.2.2:8080 90
UDP 198.18.0.53:53 wrr
  -> 198.19.1.3:5353 1
  -> 198.19.2.3:5353 2
  -> 198.19.3.3:5353 3
  -> 198.19.4.3:5353 4
`)
	addrs, _ := k.links.Addresses(DefaultInterface)
	if want := []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("198.18.0.53")}; !slices.Equal(addrs, want) {
		t.Errorf("%s addresses = %v, want %v", DefaultInterface, addrs, want)
	}
	entries, _ := k.sets.Entries(SetVIPs)
	if want := []SetEntry{{"198.18.0.10,tcp:80", "demo/web:p"}, {"198.18.0.53,udp:53", "demo/dns:p"}}; !slices.Equal(entries, want) {
		t.Errorf("%s = %v, want %v", SetVIPs, entries, want)
	}
	loop, _ := k.sets.Entries(SetLoopback)
	if len(loop) != 6 || loop[0].Member != "198.19.1.2,tcp:8080,198.19.1.2" {
		t.Errorf("%s = %v, want one member per destination", SetLoopback, loop)
	}

	// A weight change writes that destination only; an unchanged Service
	// is not even read back on a partial Sync.
	before := maps(k.ipvs.DestWrites)
	writes := k.ipvs.Writes
	web.Detach() // the record shares the synced Backends
	web.Backends[1].Weight = 30
	k.sync(t, state(web, dns), false)
	if k.ipvs.Writes != writes+1 {
		t.Errorf("%d writes for one weight change, want 1", k.ipvs.Writes-writes)
	}
	if k.ipvs.DestWrites["198.18.0.10:80/TCP -> 198.19.2.2:8080"] != before["198.18.0.10:80/TCP -> 198.19.2.2:8080"]+1 {
		t.Errorf("changed destination not written: %v", k.ipvs.DestWrites)
	}
	if k.ipvs.DestWrites["198.18.0.10:80/TCP -> 198.19.1.2:8080"] != before["198.18.0.10:80/TCP -> 198.19.1.2:8080"] {
		t.Errorf("unchanged destination was written: %v", k.ipvs.DestWrites)
	}
	if k.p.LastSync.ServicesRead != 1 {
		t.Errorf("partial Sync read %d services back, want 1 (the changed one)", k.p.LastSync.ServicesRead)
	}
	// Nothing changed: nothing written, even on a full Sync.
	writes = k.ipvs.Writes
	k.sync(t, state(web, dns), true)
	k.sync(t, state(web, dns), false)
	if k.ipvs.Writes != writes {
		t.Errorf("%d writes with nothing changed", k.ipvs.Writes-writes)
	}

	// A Service that leaves: its virtual server, VIP and set members go.
	k.sync(t, state(web), false)
	checkDump(t, k, `TCP 198.18.0.10:80 wrr
  -> 198.19.1.2:8080 10
  -> 198.19.2.2:8080 30
`)
	addrs, _ = k.links.Addresses(DefaultInterface)
	if want := []netip.Addr{netip.MustParseAddr("198.18.0.10")}; !slices.Equal(addrs, want) {
		t.Errorf("%s addresses = %v, want %v", DefaultInterface, addrs, want)
	}
	entries, _ = k.sets.Entries(SetVIPs)
	if len(entries) != 1 {
		t.Errorf("%s = %v, want only web", SetVIPs, entries)
	}
	loop, _ = k.sets.Entries(SetLoopback)
	if len(loop) != 2 {
		t.Errorf("%s = %v, want web's 2 destinations", SetLoopback, loop)
	}
}

func maps(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// A full Sync repairs hand edits: a changed weight, a deleted destination,
// a missing VIP address; a foreign virtual server is left alone.
func TestFullSyncRepairs(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	k.sync(t, state(web), true)
	want := k.ipvs.Dump()
	vs := VirtualServer{Address: web.VIP.IP, Port: 80, Protocol: dataplane.TCP, Scheduler: "wrr"}
	_ = k.ipvs.UpdateRealServer(vs, RealServer{Address: netip.MustParseAddr("198.19.1.2"), Port: 8080, Weight: 77})
	_ = k.ipvs.DeleteRealServer(vs, RealServer{Address: netip.MustParseAddr("198.19.2.2"), Port: 8080})
	_ = k.links.DelAddress(DefaultInterface, web.VIP.IP)
	foreign := VirtualServer{Address: netip.MustParseAddr("198.18.9.9"), Port: 443, Protocol: dataplane.TCP, Scheduler: "rr"}
	_ = k.ipvs.AddVirtualServer(foreign)
	k.sync(t, state(web), true)
	if got, wantAll := k.ipvs.Dump(), sortDump("TCP 198.18.9.9:443 rr\n"+want); got != wantAll {
		t.Fatalf("after a full Sync:\n%s\nwant:\n%s", got, wantAll)
	}
	if addrs, _ := k.links.Addresses(DefaultInterface); len(addrs) != 1 {
		t.Errorf("VIP not restored on %s: %v", DefaultInterface, addrs)
	}
}

// sortDump orders a Dump's services like Fake.Dump does.
func sortDump(s string) string {
	blocks := strings.SplitAfter(s, "\n")
	var svcs []string
	for _, l := range blocks {
		if l == "" {
			continue
		}
		if strings.HasPrefix(l, "  ") {
			svcs[len(svcs)-1] += l
		} else {
			svcs = append(svcs, l)
		}
	}
	slices.SortFunc(svcs, func(a, b string) int {
		ka := strings.Fields(a)[1] + "/" + strings.Fields(a)[0]
		kb := strings.Fields(b)[1] + "/" + strings.Fields(b)[0]
		return strings.Compare(ka, kb)
	})
	return strings.Join(svcs, "")
}

func TestGracefulDrain(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	vip := web.VIP
	leaving := netip.MustParseAddrPort("198.19.1.2:8080")
	k.sync(t, state(web), true)
	k.ipvs.SetConns(vip, leaving, 3, 5)

	// The endpoint leaves: weight 0, still there for its connections.
	gone := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.2.2:8080", 90))
	res, err := k.p.Sync(state(gone), dataplane.PartialSync)
	if err != nil {
		t.Fatal(err)
	}
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 0\n  -> 198.19.2.2:8080 90\n")
	if d := k.p.Draining()[vip]; !slices.Equal(d, []netip.AddrPort{leaving}) {
		t.Fatalf("draining = %v", d)
	}
	// The result asks for a Sync soon, to delete it after its last connection.
	if res.RequeueAfter != drainCheckInterval {
		t.Errorf("result %+v while draining, want a requeue after %v", res, drainCheckInterval)
	}
	// Explain shows the draining one as receiving nothing.
	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 || len(views[0].Backends) != 1 || views[0].Backends[0].Share != 100 {
		t.Errorf("explain while draining = %+v", views)
	}
	// Still active connections, inside the period: kept.
	k.now = k.now.Add(10 * time.Second)
	k.sync(t, state(gone), false)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 0\n  -> 198.19.2.2:8080 90\n")
	// Only inactive (TIME_WAIT) connections left: TCP counts it idle.
	k.ipvs.SetConns(vip, leaving, 0, 5)
	k.sync(t, state(gone), false)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.2.2:8080 90\n")
	if len(k.p.Draining()) != 0 {
		t.Errorf("still draining: %v", k.p.Draining())
	}

	// The period bounds the drain even with connections left.
	k.sync(t, state(web), false)
	k.ipvs.SetConns(vip, leaving, 7, 0)
	k.sync(t, state(gone), false)
	k.now = k.now.Add(DefaultGracefulPeriod - time.Second)
	k.sync(t, state(gone), false)
	if !strings.Contains(k.ipvs.Dump(), "198.19.1.2:8080 0") {
		t.Fatalf("deleted before the graceful period:\n%s", k.ipvs.Dump())
	}
	k.now = k.now.Add(time.Second)
	k.sync(t, state(gone), false)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.2.2:8080 90\n")

	// An endpoint that comes back while draining gets its weight back.
	k.sync(t, state(web), false)
	k.ipvs.SetConns(vip, leaving, 1, 0)
	k.sync(t, state(gone), false)
	k.sync(t, state(web), false)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 10\n  -> 198.19.2.2:8080 90\n")
	if len(k.p.Draining()) != 0 {
		t.Errorf("still draining after coming back: %v", k.p.Draining())
	}
}

// UDP has no connection state: a destination is idle when no entry of any
// kind is left.
func TestGracefulDrainUDP(t *testing.T) {
	k := newTestKernel(t)
	dns := svc("dns", "198.18.0.53", 53, dataplane.UDP, be("198.19.1.3:5353", 1), be("198.19.2.3:5353", 1))
	k.sync(t, state(dns), true)
	leaving := netip.MustParseAddrPort("198.19.1.3:5353")
	k.ipvs.SetConns(dns.VIP, leaving, 0, 2)
	gone := svc("dns", "198.18.0.53", 53, dataplane.UDP, be("198.19.2.3:5353", 1))
	k.sync(t, state(gone), false)
	k.sync(t, state(gone), false)
	if !strings.Contains(k.ipvs.Dump(), "198.19.1.3:5353 0") {
		t.Fatalf("UDP destination with flows deleted:\n%s", k.ipvs.Dump())
	}
	k.ipvs.SetConns(dns.VIP, leaving, 0, 0)
	k.sync(t, state(gone), false)
	checkDump(t, k, "UDP 198.18.0.53:53 wrr\n  -> 198.19.2.3:5353 1\n")
}

// kubernetes#92019: after a restart, a destination found at weight 0 that
// is not desired keeps draining; it is never raised back, and it goes once
// idle.
func TestRestartKeepsDrainingDestinations(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	gone := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.2.2:8080", 90))
	leaving := netip.MustParseAddrPort("198.19.1.2:8080")
	k.sync(t, state(web), true)
	k.ipvs.SetConns(web.VIP, leaving, 2, 0)
	k.sync(t, state(gone), false)
	table := k.ipvs.Dump()

	k.restart()
	writes := k.ipvs.Writes
	k.sync(t, state(gone), true)
	if got := k.ipvs.Dump(); got != table {
		t.Fatalf("restart changed the table:\n%s\nwant:\n%s", got, table)
	}
	if k.ipvs.Writes != writes {
		t.Errorf("restart wrote %d times", k.ipvs.Writes-writes)
	}
	if d := k.p.Draining()[web.VIP]; !slices.Equal(d, []netip.AddrPort{leaving}) {
		t.Fatalf("draining after restart = %v", d)
	}
	// The graceful period starts again at the restart.
	k.now = k.now.Add(DefaultGracefulPeriod / 2)
	k.sync(t, state(gone), false)
	if !strings.Contains(k.ipvs.Dump(), "198.19.1.2:8080 0") {
		t.Fatalf("deleted early:\n%s", k.ipvs.Dump())
	}
	k.ipvs.SetConns(web.VIP, leaving, 0, 0)
	k.sync(t, state(gone), false)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.2.2:8080 90\n")

	// A restart with an unchanged desired state writes nothing at all.
	k.restart()
	writes = k.ipvs.Writes
	k.sync(t, state(gone), true)
	if k.ipvs.Writes != writes {
		t.Errorf("restart wrote %d times", k.ipvs.Writes-writes)
	}
}

// Backends with weight 0 in the desired state (drained by annotation, not
// ready) stay as destinations at weight 0; a Service without a usable
// backend is a reject in explain.
func TestZeroWeightsAndReject(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 0), be("198.19.2.2:8080", 1))
	empty := svc("empty", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.9:8080", 0))
	k.sync(t, state(web, empty), true)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 0\n  -> 198.19.2.2:8080 1\nTCP 198.18.0.11:80 wrr\n  -> 198.19.1.9:8080 0\n")
	if len(k.p.Draining()) != 0 {
		t.Errorf("desired weight-0 destinations treated as draining: %v", k.p.Draining())
	}
	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(state(web, empty)), views); len(diff) != 0 {
		t.Errorf("explain differs from the desired state:\n%s", strings.Join(diff, "\n"))
	}
}

func TestSchedulers(t *testing.T) {
	k := newTestKernel(t)
	k.cfg.Scheduler = "rr"
	k.restart()
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1))
	api := svc("api", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.3:8080", 1))
	api.Scheduler = "mh"
	k.sync(t, state(web, api), true)
	checkDump(t, k, "TCP 198.18.0.10:80 rr\n  -> 198.19.1.2:8080 1\nTCP 198.18.0.11:80 mh\n  -> 198.19.1.3:8080 1\n")
	// A scheduler change updates the virtual server in place: its
	// destinations (and their connections) stay.
	writes := maps(k.ipvs.DestWrites)
	api.Scheduler = "sh"
	k.sync(t, state(web, api), false)
	checkDump(t, k, "TCP 198.18.0.10:80 rr\n  -> 198.19.1.2:8080 1\nTCP 198.18.0.11:80 sh\n  -> 198.19.1.3:8080 1\n")
	if !equalMaps(writes, k.ipvs.DestWrites) {
		t.Errorf("a scheduler change rewrote destinations: %v -> %v", writes, k.ipvs.DestWrites)
	}
	// A scheduler the kernel lacks fails the Sync clearly; the next is full.
	api.Scheduler = "nosuch"
	if _, err := k.p.Sync(state(web, api), dataplane.PartialSync); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Sync with an unknown scheduler: %v", err)
	}
	api.Scheduler = "wlc"
	k.sync(t, state(web, api), false)
	if !k.p.LastSync.Full {
		t.Errorf("Sync after a failure was not full")
	}
}

func equalMaps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestExplainMatchesExpected(t *testing.T) {
	k := newTestKernel(t)
	st := state(
		svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90)),
		svc("split", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.2:8080", 90.0/7), be("198.19.2.2:8080", 6*90.0/7), be("198.19.3.2:8080", 10)),
		svc("dns", "198.18.0.53", 53, dataplane.UDP, be("198.19.1.3:5353", 1), be("198.19.2.3:5353", 2), be("198.19.3.3:5353", 3), be("198.19.4.3:5353", 4)),
	)
	k.sync(t, st, true)
	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(st), views); len(diff) != 0 {
		t.Errorf("explain differs from the desired state:\n%s", strings.Join(diff, "\n"))
	}
	var b strings.Builder
	_ = dataplane.WriteViews(&b, views, "text")
	if !strings.Contains(b.String(), "198.18.0.10:80/TCP  198.19.1.2:8080 10.00%  198.19.2.2:8080 90.00%  demo/web:p") {
		t.Errorf("explain text:\n%s", b.String())
	}
	// A VIP someone removed from the interface is reported.
	_ = k.links.DelAddress(DefaultInterface, netip.MustParseAddr("198.18.0.53"))
	views, _ = k.p.Explain()
	for _, v := range views {
		if v.VIP == "198.18.0.53" && len(v.Problems) == 0 {
			t.Errorf("no problem for a VIP missing from %s", DefaultInterface)
		}
	}
}

func TestMasqueradeRulesStayAFixedHandful(t *testing.T) {
	count := func(n int) int {
		k := newTestKernel(t)
		var sps []dataplane.ServicePort
		for i := range n {
			sps = append(sps, svc(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1), 80, dataplane.TCP, be(fmt.Sprintf("198.19.%d.%d:8080", i/250, i%250+1), 1)))
		}
		k.sync(t, state(sps...), true)
		saved, _ := k.ipt.SaveAll()
		rules := strings.Count(string(saved), "\n-A ")
		if e, _ := k.sets.Entries(SetVIPs); len(e) != n {
			t.Errorf("%d services: %d VIP set members", n, len(e))
		}
		return rules
	}
	one, many := count(1), count(1000)
	if one != many || one > 16 {
		t.Errorf("rules: %d for 1 Service, %d for 1,000; want the same handful", one, many)
	}
	k := newTestKernel(t)
	k.sync(t, state(svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1))), true)
	saved, _ := k.ipt.SaveAll()
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"steelyard ipvs services\" -j IPVS-STEELYARD-SERVICES",
		"-A IPVS-STEELYARD-SERVICES -s 198.19.0.0/16",
		"--match-set STEELYARD-IPVS-LOOP dst,dst,src -j MASQUERADE",
		"-A INPUT -m conntrack --ctstate NEW -m comment --comment \"steelyard ipvs filter\" -j IPVS-STEELYARD-FILTER",
		"-A IPVS-STEELYARD-FILTER -m set --match-set STEELYARD-IPVS-DROP dst,dst",
		"--match-set STEELYARD-IPVS-LB-FW dst,dst -m set ! --match-set STEELYARD-IPVS-LB-SRC dst,dst,src",
		"-A IPVS-STEELYARD-SERVICES -m set --match-set STEELYARD-IPVS-EXT-LOCAL dst,dst",
	} {
		if !strings.Contains(string(saved), want) {
			t.Errorf("rules lack %q:\n%s", want, saved)
		}
	}
}

func TestSysctls(t *testing.T) {
	k := newTestKernel(t)
	k.sync(t, state(), true)
	for _, sc := range Sysctls {
		b, _ := os.ReadFile(filepath.Join(k.cfg.SysctlDir, strings.ReplaceAll(sc.Name, ".", "/")))
		if strings.TrimSpace(string(b)) != sc.Value {
			t.Errorf("%s = %q, want %s", sc.Name, b, sc.Value)
		}
	}
	k.cfg.SysctlDir = t.TempDir()
	k.restart()
	_, err := k.p.Sync(state(), dataplane.FullSync)
	if err == nil || !strings.Contains(err.Error(), "net.ipv4.vs.conntrack is missing") {
		t.Errorf("Sync without IPVS sysctls: %v", err)
	}
}

func TestCleanupRemovesOnlyOurs(t *testing.T) {
	k := newTestKernel(t)
	k.sync(t, state(svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1))), true)
	foreign := VirtualServer{Address: netip.MustParseAddr("198.18.9.9"), Port: 443, Protocol: dataplane.TCP, Scheduler: "rr"}
	_ = k.ipvs.AddVirtualServer(foreign)
	_ = k.ipt.AddRule(iptables.TableNAT, "POSTROUTING", "-j", "MASQUERADE")
	if err := k.p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := k.ipvs.Dump(); got != "TCP 198.18.9.9:443 rr\n" {
		t.Errorf("after cleanup:\n%s", got)
	}
	if k.links.Exists(DefaultInterface) {
		t.Errorf("%s still exists", DefaultInterface)
	}
	if k.sets.Exists(SetVIPs) || k.sets.Exists(SetLoopback) {
		t.Errorf("sets still exist")
	}
	saved, _ := k.ipt.SaveAll()
	if strings.Contains(string(saved), "STEELYARD") || !strings.Contains(string(saved), "-A POSTROUTING -j MASQUERADE") {
		t.Errorf("rules after cleanup:\n%s", saved)
	}
	// Twice is fine.
	if err := k.p.Cleanup(); err != nil {
		t.Errorf("second cleanup: %v", err)
	}
}

func TestIntWeights(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want []int
	}{
		{[]float64{10, 90}, []int{10, 90}},
		{[]float64{1, 2, 3, 4}, []int{1, 2, 3, 4}},
		{[]float64{0, 5, 0}, []int{0, 5, 0}},
		{[]float64{0, 0}, []int{0, 0}},
		{[]float64{90.0 / 7, 6 * 90.0 / 7, 10}, []int{90, 540, 70}},
		{[]float64{45, 45, 10.0 / 3, 10.0 / 3, 10.0 / 3}, []int{135, 135, 10, 10, 10}},
		{[]float64{1e-9, 1}, []int{1, 1000000}},
	} {
		if got := IntWeights(c.in); !slices.Equal(got, c.want) {
			t.Errorf("IntWeights(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	// Random fractional weights: every share within ShareError.
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(50)
		ws := make([]float64, n)
		var sum float64
		for i := range ws {
			if r.IntN(10) > 0 {
				ws[i] = r.Float64() * float64(1+r.IntN(65535))
			}
			sum += ws[i]
		}
		got := IntWeights(ws)
		var isum int
		for _, g := range got {
			isum += g
		}
		for i := range ws {
			if (ws[i] > 0) != (got[i] > 0) {
				t.Fatalf("weight %v became %d", ws[i], got[i])
			}
			if sum == 0 {
				continue
			}
			exact := 100 * ws[i] / sum
			share := 100 * float64(got[i]) / float64(isum)
			if math.Abs(exact-share) > ShareError {
				t.Fatalf("IntWeights(%v)[%d]: share %.5f%%, exact %.5f%%", ws, i, share, exact)
			}
		}
	}
}

// BenchmarkSync10000 measures Syncs of 10,000 Services x 10 endpoints on the
// fake: the first (everything added), a full one with nothing to change,
// and a partial one after one weight change.
func BenchmarkSync10000(b *testing.B) {
	const n = 10000
	mk := func(w float64) dataplane.State {
		sps := make([]dataplane.ServicePort, 0, n)
		for i := range n {
			var bes []dataplane.Backend
			for j := range 10 {
				bes = append(bes, be(fmt.Sprintf("198.19.%d.%d:%d", i/250, i%250+1, 8000+j), float64(j+1)))
			}
			sps = append(sps, svc(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.%d.%d", i/250, i%250+1), 80, dataplane.TCP, bes...))
		}
		sps[0].Backends[0].Weight = w
		return state(sps...)
	}
	st1, st2 := mk(1), mk(5)
	b.Run("initial", func(b *testing.B) {
		for range b.N {
			k := newTestKernel(b)
			k.sync(b, st1, true)
		}
	})
	k := newTestKernel(b)
	k.sync(b, st1, true)
	b.Run("full-unchanged", func(b *testing.B) {
		for range b.N {
			k.sync(b, st1, true)
		}
	})
	b.Run("partial-one-weight", func(b *testing.B) {
		for i := range b.N {
			if i%2 == 0 {
				k.sync(b, st2, false)
			} else {
				k.sync(b, st1, false)
			}
		}
	})
}

// A full Sync checks the masquerade rules with one iptables-save and
// rewrites them when a jump or rule went missing.
func TestFullSyncRestoresRules(t *testing.T) {
	k := newTestKernel(t)
	st := state(svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1)))
	k.sync(t, st, true)
	want, _ := k.ipt.SaveAll()
	restores := k.ipt.Restores
	k.sync(t, st, true)
	if k.ipt.Restores != restores {
		t.Errorf("a full Sync rewrote rules that were in place")
	}
	if err := k.ipt.DeleteRule(iptables.TableNAT, "POSTROUTING", ipvsJumps[2].args()...); err != nil {
		t.Fatal(err)
	}
	if err := k.ipt.DeleteRuleAt(iptables.TableNAT, ChainServices, 1); err != nil {
		t.Fatal(err)
	}
	k.sync(t, st, true)
	if got, _ := k.ipt.SaveAll(); string(got) != string(want) {
		t.Errorf("rules not restored:\n%s\nwant:\n%s", got, want)
	}
}

// Backends kept away from VIP traffic (out of zone, or not local under
// internalTrafficPolicy Local) are destinations at weight 0; the IPv4
// Proxier leaves IPv6 Service ports to the IPv6 one without failing.
func TestInternalBackendsAffinityAndIPv6(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1), be("198.19.2.2:8080", 3))
	web.Backends[0].LocalOnly = true
	web.AffinitySeconds = 600
	v6 := svc("web6", "2001:2::10", 80, dataplane.TCP, be("[2001:2:1::2]:8080", 1))
	k.sync(t, state(web, v6), true)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 0\n  -> 198.19.2.2:8080 3\n")
	if vss, _ := k.ipvs.VirtualServers(); len(vss) != 1 || vss[0].Persistence != 600 {
		t.Errorf("session affinity not IPVS persistence: %+v", vss)
	}
	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	want := dataplane.Expected(state(web))
	if diff := dataplane.Diff(want, views); len(diff) != 0 {
		t.Errorf("explain differs:\n%s", strings.Join(diff, "\n"))
	}
}

// A partial Sync notices a flushed IPVS table and re-adds the virtual
// servers that went (ipvsadm -C touches neither the sets nor the rules, so
// nothing else is rewritten), and a deleted interface makes it run full,
// putting everything back.
func TestPartialSyncCanary(t *testing.T) {
	k := newTestKernel(t)
	st := state(svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90)))
	k.sync(t, st, true)
	want := k.ipvs.Dump()
	k.sync(t, st, false)
	if k.p.LastSync.Full {
		t.Fatalf("partial Sync ran full with everything in place")
	}
	vss, _ := k.ipvs.VirtualServers()
	for _, vs := range vss {
		_ = k.ipvs.DeleteVirtualServer(vs)
	}
	restores := k.ipt.Restores
	k.sync(t, st, false)
	if st := k.p.LastSync; st.Full || !st.CanaryMissing || st.ServicesWritten != 1 || st.DestWrites != 2 {
		t.Errorf("stats %+v after a flush, want a repair of 1 virtual server with 2 destinations", k.p.LastSync)
	}
	if k.ipt.Restores != restores {
		t.Errorf("the repair of a flushed IPVS table rewrote the iptables rules (%d restores)", k.ipt.Restores-restores)
	}
	checkDump(t, k, want)
	k.sync(t, st, false)
	if st := k.p.LastSync; st.CanaryMissing || st.ServicesWritten != 0 {
		t.Errorf("stats %+v on the Sync after the repair, want nothing written", st)
	}
	_ = k.links.DeleteDummy(DefaultInterface)
	k.sync(t, st, false)
	if !k.p.LastSync.CanaryMissing {
		t.Errorf("stats %+v after the interface was deleted, want a full Sync", k.p.LastSync)
	}
	if addrs, _ := k.links.Addresses(DefaultInterface); len(addrs) != 1 {
		t.Errorf("VIP not back on %s: %v", DefaultInterface, addrs)
	}
}

// parityState is one Service port per kube-proxy parity feature (node 198.19.0.1
// and 198.19.254.1; local backends are Local: true):
//
//	np     NodePort 30080, Cluster policy, 10/90 with one remote backend
//	lb     externalIP 198.18.1.10, LB IP 198.18.2.10 with source ranges, node port 30081
//	etp    externalTrafficPolicy Local, node port 30082 and LB IP 198.18.2.20: 1:3 local, 6 remote
//	none   externalTrafficPolicy Local, node port 30083, only a remote backend
//	itp    internalTrafficPolicy Local, only a remote backend
//	aff    ClientIP affinity 10 s on a node port
func parityState() dataplane.State {
	local := func(b dataplane.Backend) dataplane.Backend { b.Local = true; return b }
	np := svc("np", "198.18.0.20", 80, dataplane.TCP, local(be("198.19.20.2:8080", 10)), be("198.19.20.3:8080", 90))
	np.NodePort = 30080
	lb := svc("lb", "198.18.0.21", 80, dataplane.TCP, be("198.19.21.2:8080", 10), be("198.19.21.3:8080", 90))
	lb.NodePort = 30081
	lb.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.10")}
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.10")}
	lb.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.19.254.0/25"), netip.MustParsePrefix("198.19.253.0/24")}
	etp := svc("etp", "198.18.0.22", 80, dataplane.TCP, local(be("198.19.22.2:8080", 1)), local(be("198.19.22.3:8080", 3)), be("198.19.22.4:8080", 6))
	etp.NodePort, etp.ExternalLocal, etp.HealthCheckNodePort = 30082, true, 30992
	etp.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("198.18.2.20")}
	none := svc("none", "198.18.0.23", 80, dataplane.TCP, be("198.19.22.5:8080", 1))
	none.NodePort, none.ExternalLocal = 30083, true
	itp := svc("itp", "198.18.0.25", 80, dataplane.TCP, be("198.19.23.5:8080", 1))
	itp.InternalLocal = true
	aff := svc("aff", "198.18.0.26", 80, dataplane.TCP, local(be("198.19.24.2:8080", 20)), be("198.19.24.3:8080", 80))
	aff.NodePort, aff.AffinitySeconds = 30086, 10
	return state(np, lb, etp, none, itp, aff)
}

func nodeAddrs(as ...string) func() []netip.Addr {
	return func() []netip.Addr {
		var out []netip.Addr
		for _, a := range as {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
}

func TestEntryPoints(t *testing.T) {
	k := newTestKernel(t)
	// The node's address list includes a VIP on steelyard0 (taken from
	// every interface) and an IPv6 address: both are left out.
	k.cfg.NodeAddresses = nodeAddrs("198.19.254.1", "198.19.0.1", "198.18.0.20", "2001:2:0:fe::1")
	k.restart()
	st := parityState()
	k.sync(t, st, true)
	dump := k.ipvs.Dump()
	for _, want := range []string{
		// Node port on each node address, Cluster policy: every backend.
		"TCP 198.19.0.1:30080 wrr\n  -> 198.19.20.2:8080 10\n  -> 198.19.20.3:8080 90\n",
		"TCP 198.19.254.1:30080 wrr\n  -> 198.19.20.2:8080 10\n  -> 198.19.20.3:8080 90\n",
		"TCP 198.18.1.10:80 wrr\n  -> 198.19.21.2:8080 10\n  -> 198.19.21.3:8080 90\n",
		"TCP 198.18.2.10:80 wrr\n",
		// ETP Local: the remote backend stays at weight 0 on external entries,
		// the clusterIP still reaches it.
		"TCP 198.19.0.1:30082 wrr\n  -> 198.19.22.2:8080 1\n  -> 198.19.22.3:8080 3\n  -> 198.19.22.4:8080 0\n",
		"TCP 198.18.2.20:80 wrr\n  -> 198.19.22.2:8080 1\n  -> 198.19.22.3:8080 3\n  -> 198.19.22.4:8080 0\n",
		"TCP 198.18.0.22:80 wrr\n  -> 198.19.22.2:8080 1\n  -> 198.19.22.3:8080 3\n  -> 198.19.22.4:8080 6\n",
		"TCP 198.19.0.1:30083 wrr\n  -> 198.19.22.5:8080 0\n",
		"TCP 198.18.0.25:80 wrr\n  -> 198.19.23.5:8080 0\n",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("IPVS table lacks\n%s\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "198.18.0.20:30080") || strings.Contains(dump, "2001:2") {
		t.Errorf("node port on a VIP or an IPv6 address:\n%s", dump)
	}
	vss, _ := k.ipvs.VirtualServers()
	for _, vs := range vss {
		if (vs.Port == 30086 || vs.Address == netip.MustParseAddr("198.18.0.26")) && vs.Persistence != 10 {
			t.Errorf("%s: persistence %d, want 10 (affinity on every entry point)", vs.Key(), vs.Persistence)
		}
	}
	// Only clusterIP, external and LB IPs on the dummy interface.
	addrs, _ := k.links.Addresses(DefaultInterface)
	for _, a := range addrs {
		if a == netip.MustParseAddr("198.19.0.1") || a == netip.MustParseAddr("198.19.254.1") {
			t.Errorf("node address %s put on %s", a, DefaultInterface)
		}
	}
	if !slices.Contains(addrs, netip.MustParseAddr("198.18.1.10")) || !slices.Contains(addrs, netip.MustParseAddr("198.18.2.20")) {
		t.Errorf("external and LB IPs missing from %s: %v", DefaultInterface, addrs)
	}
	members := func(set string) []string {
		es, _ := k.sets.Entries(set)
		var out []string
		for _, e := range es {
			out = append(out, strings.TrimSpace(e.Member+" "+e.Comment))
		}
		return out
	}
	for set, want := range map[string][]string{
		SetExternal: {"198.18.1.10,tcp:80 demo/lb:p|externalIP", "198.18.2.10,tcp:80 demo/lb:p|loadBalancer",
			"198.19.0.1,tcp:30080 demo/np:p|nodePort", "198.19.0.1,tcp:30081 demo/lb:p|nodePort", "198.19.0.1,tcp:30086 demo/aff:p|nodePort",
			"198.19.254.1,tcp:30080 demo/np:p|nodePort", "198.19.254.1,tcp:30081 demo/lb:p|nodePort", "198.19.254.1,tcp:30086 demo/aff:p|nodePort"},
		SetExternalLocal: {"198.18.2.20,tcp:80 demo/etp:p|loadBalancer", "198.19.0.1,tcp:30082 demo/etp:p|nodePort", "198.19.0.1,tcp:30083 demo/none:p|nodePort",
			"198.19.254.1,tcp:30082 demo/etp:p|nodePort", "198.19.254.1,tcp:30083 demo/none:p|nodePort"},
		SetDrop:         {"198.18.0.25,tcp:80", "198.19.0.1,tcp:30083", "198.19.254.1,tcp:30083"},
		SetFirewall:     {"198.18.2.10,tcp:80"},
		SetSourceRanges: {"198.18.2.10,tcp:80,198.19.253.0/24 1", "198.18.2.10,tcp:80,198.19.254.0/25 0"},
	} {
		if got := members(set); !slices.Equal(got, want) {
			t.Errorf("%s:\n%s\nwant:\n%s", set, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if got := members(SetVIPs); !slices.Contains(got, "198.18.0.25,tcp:80 demo/itp:p|Local") {
		t.Errorf("%s lacks the ITP Local clusterIP: %v", SetVIPs, got)
	}

	// Explain agrees with the desired state: one view per entry point.
	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(st), views); len(diff) != 0 {
		t.Errorf("explain differs from the desired state:\n%s", strings.Join(diff, "\n"))
	}
	var b strings.Builder
	_ = dataplane.WriteViews(&b, views, "text")
	for _, want := range []string{
		"0.0.0.0:30080/TCP  198.19.20.2:8080 10.00%  198.19.20.3:8080 90.00%  demo/np:p  [nodePort, on 198.19.0.1,198.19.254.1, policy Cluster]",
		"0.0.0.0:30082/TCP  198.19.22.2:8080 25.00%  198.19.22.3:8080 75.00%  demo/etp:p  [nodePort, on 198.19.0.1,198.19.254.1, policy Local]",
		"0.0.0.0:30083/TCP  drop (no local endpoints)  demo/none:p  [nodePort, on 198.19.0.1,198.19.254.1, policy Local]",
		"198.18.0.25:80/TCP  drop (no local endpoints)  demo/itp:p  [clusterIP, policy Local]",
		"198.18.2.10:80/TCP  198.19.21.2:8080 10.00%  198.19.21.3:8080 90.00%  demo/lb:p  [loadBalancer, policy Cluster, from 198.19.254.0/25,198.19.253.0/24]",
		"0.0.0.0:30086/TCP  198.19.24.2:8080 20.00%  198.19.24.3:8080 80.00%  demo/aff:p  [nodePort, on 198.19.0.1,198.19.254.1, policy Cluster, affinity ClientIP 10s]",
	} {
		if !strings.Contains(b.String(), want+"\n") {
			t.Errorf("explain lacks\n%s\n%s", want, b.String())
		}
	}

	// A restart with the same state writes nothing; so does a partial Sync.
	k.restart()
	writes := k.ipvs.Writes
	k.sync(t, st, true)
	k.sync(t, st, false)
	if k.ipvs.Writes != writes {
		t.Errorf("%d IPVS writes with nothing changed", k.ipvs.Writes-writes)
	}

	// The node loses an address: its node-port virtual servers and set
	// members go, on a partial Sync.
	k.cfg.NodeAddresses = nodeAddrs("198.19.0.1")
	k.p.cfg.NodeAddresses = k.cfg.NodeAddresses // what the node's address function returns now
	k.sync(t, st, false)
	if d := k.ipvs.Dump(); strings.Contains(d, "198.19.254.1:") {
		t.Errorf("node port left on a removed node address:\n%s", d)
	}
	for _, set := range []string{SetExternal, SetExternalLocal, SetDrop} {
		for _, m := range members(set) {
			if strings.HasPrefix(m, "198.19.254.1,") {
				t.Errorf("%s keeps %s", set, m)
			}
		}
	}

	// A local endpoint appears for "none": the drop goes, the node port
	// forwards to it; ETP flips to Cluster for "etp": it moves sets.
	st2 := parityState()
	for i := range st2.Services {
		sp := &st2.Services[i]
		switch sp.Name.Name {
		case "none":
			sp.Backends[0].Local = true
		case "etp":
			sp.ExternalLocal = false
		}
	}
	k.sync(t, st2, false)
	if got := members(SetDrop); !slices.Equal(got, []string{"198.18.0.25,tcp:80"}) {
		t.Errorf("%s after a local endpoint appeared: %v", SetDrop, got)
	}
	if got := members(SetExternalLocal); len(got) != 1 || !strings.HasPrefix(got[0], "198.19.0.1,tcp:30083 ") {
		t.Errorf("%s after etp became Cluster: %v", SetExternalLocal, got)
	}
	views, _ = k.p.Explain()
	if diff := dataplane.Diff(dataplane.Expected(st2), views); len(diff) != 0 {
		t.Errorf("explain after partial Syncs differs:\n%s", strings.Join(diff, "\n"))
	}
	// A full Sync from a fresh proxier agrees with what the partial ones did.
	before := k.ipvs.Dump()
	k.restart()
	k.sync(t, st2, true)
	if got := k.ipvs.Dump(); got != before {
		t.Errorf("full Sync after partial ones changed the table:\n%s\nwant:\n%s", got, before)
	}

	// Cleanup removes the node-port virtual servers too, and every set.
	if err := k.p.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if d := k.ipvs.Dump(); d != "" {
		t.Errorf("left after cleanup:\n%s", d)
	}
	for _, st := range setTypes {
		if k.sets.Exists(st.name) {
			t.Errorf("set %s left after cleanup", st.name)
		}
	}
}

// A destination shared by two Services keeps its loopback member when
// only one of them lets it go (partial Sync).
func TestSharedLoopbackMember(t *testing.T) {
	k := newTestKernel(t)
	a := svc("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 1), be("198.19.1.3:8080", 1))
	b := svc("b", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.2:8080", 1))
	k.sync(t, state(a, b), true)
	a2 := svc("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3:8080", 1))
	k.ipvs.SetConns(a.VIP, netip.MustParseAddrPort("198.19.1.2:8080"), 0, 0)
	k.sync(t, state(a2, b), false) // drains at weight 0
	k.sync(t, state(a2, b), false) // idle: deleted
	if strings.Contains(k.ipvs.Dump(), "198.18.0.10:80 wrr\n  -> 198.19.1.2") {
		t.Fatalf("not deleted:\n%s", k.ipvs.Dump())
	}
	loop, _ := k.sets.Entries(SetLoopback)
	if !slices.Contains(loop, SetEntry{Member: "198.19.1.2,tcp:8080,198.19.1.2"}) {
		t.Errorf("loopback member of a destination still used by b removed: %v", loop)
	}
}

// A partial Sync trusts the change tracker's set: the virtual servers of
// Services outside SyncRequest.Changed are reused as built last time,
// without comparing their ports; a full Sync compares everything.
func TestPartialSyncBuildsOnlyTheChangedServices(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.1.3:8080", 90))
	api := svc("api", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4:8080", 1))
	k.sync(t, state(web, api), true)
	web2 := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 50), be("198.19.1.3:8080", 50))
	api2 := svc("api", "198.18.0.11", 80, dataplane.TCP, be("198.19.1.4:8080", 3))
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{{Namespace: "demo", Name: "web"}: true}}
	if _, err := k.p.Sync(state(web2, api2), req); err != nil {
		t.Fatal(err)
	}
	// api is not in the changed set: its weight stays as written.
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 50\n  -> 198.19.1.3:8080 50\nTCP 198.18.0.11:80 wrr\n  -> 198.19.1.4:8080 1\n")
	k.sync(t, state(web2, api2), true)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 50\n  -> 198.19.1.3:8080 50\nTCP 198.18.0.11:80 wrr\n  -> 198.19.1.4:8080 3\n")
}

// A flush that takes some virtual servers (one of them with a draining
// destination) re-adds exactly those, each with its desired destinations;
// the untouched one is not rewritten and its draining destination goes on
// draining.
func TestPartialSyncRepairsSomeVirtualServers(t *testing.T) {
	k := newTestKernel(t)
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	api := svc("api", "198.18.0.11", 443, dataplane.TCP, be("198.19.1.3:8443", 1), be("198.19.2.3:8443", 1))
	k.sync(t, state(web, api), true)
	// One destination of each leaves while it has a connection: both drain.
	web2 := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10))
	api2 := svc("api", "198.18.0.11", 443, dataplane.TCP, be("198.19.1.3:8443", 1))
	for _, c := range []struct{ vip, dest string }{{"198.18.0.10:80", "198.19.2.2:8080"}, {"198.18.0.11:443", "198.19.2.3:8443"}} {
		ap := netip.MustParseAddrPort(c.vip)
		if !k.ipvs.SetConns(dataplane.VIP{IP: ap.Addr(), Port: ap.Port(), Protocol: dataplane.TCP}, netip.MustParseAddrPort(c.dest), 1, 0) {
			t.Fatalf("no destination %s of %s", c.dest, c.vip)
		}
	}
	k.sync(t, state(web2, api2), false)
	if d := k.p.Draining(); len(d) != 2 {
		t.Fatalf("draining %v, want one destination of each Service", d)
	}
	vss, _ := k.ipvs.VirtualServers()
	for _, vs := range vss {
		if vs.Address == netip.MustParseAddr("198.18.0.10") {
			_ = k.ipvs.DeleteVirtualServer(vs)
		}
	}
	k.sync(t, state(web2, api2), false)
	if st := k.p.LastSync; st.Full || !st.CanaryMissing || st.ServicesWritten != 1 || st.DestWrites != 1 {
		t.Errorf("stats %+v, want the flushed virtual server re-added with its one desired destination", st)
	}
	d := k.p.Draining()
	if len(d) != 1 || len(d[dataplane.VIP{IP: netip.MustParseAddr("198.18.0.11"), Port: 443, Protocol: dataplane.TCP}]) != 1 {
		t.Errorf("draining %v, want only api's destination (web's went with the flush)", d)
	}
	checkDump(t, k, `TCP 198.18.0.10:80 wrr
  -> 198.19.1.2:8080 10
TCP 198.18.0.11:443 wrr
  -> 198.19.1.3:8443 1
  -> 198.19.2.3:8443 0
`)
}

// A closed Config.Stop ends a Sync before its next virtual server: nothing
// more is written, the Sync fails with ErrShutdown, and the next Proxier
// (a restart) completes the work.
func TestSyncStops(t *testing.T) {
	k := newTestKernel(t)
	stop := make(chan struct{})
	k.cfg.Stop = stop
	k.restart()
	var svcs []dataplane.ServicePort
	for i := 0; i < 5; i++ {
		svcs = append(svcs, svc(fmt.Sprintf("s%d", i), fmt.Sprintf("198.18.0.%d", 10+i), 80, dataplane.TCP, be(fmt.Sprintf("198.19.1.%d:8080", 2+i), 1)))
	}
	k.sync(t, state(svcs[:2]...), true)
	before := k.ipvs.Dump()
	close(stop)
	if _, err := k.p.Sync(state(svcs...), dataplane.SyncRequest{}); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Sync after Stop: %v, want ErrShutdown", err)
	}
	checkDump(t, k, before)
	k.cfg.Stop = nil
	k.restart()
	k.sync(t, state(svcs...), false)
	if vss, _ := k.ipvs.VirtualServers(); len(vss) != 5 {
		t.Errorf("%d virtual servers after the restart's Sync, want 5", len(vss))
	}
}
