package ipvs

import (
	"net/netip"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Counts sums each destination's InConns over a Service port's virtual
// servers (clusterIP and node port here); a weight change keeps them.
func TestCounts(t *testing.T) {
	k := newTestKernel(t)
	k.cfg.NodeAddresses = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("198.19.0.1")} }
	k.restart()
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.2.2:8080", 90))
	web.NodePort = 30080
	k.sync(t, state(web), true)
	a, b := netip.MustParseAddrPort("198.19.1.2:8080"), netip.MustParseAddrPort("198.19.2.2:8080")
	for _, sched := range []struct {
		vip string
		n   [2]uint64
	}{{"198.18.0.10:80", [2]uint64{10, 90}}, {"198.19.0.1:30080", [2]uint64{1, 9}}} {
		vip := vipOf(sched.vip, dataplane.TCP)
		if !k.ipvs.Schedule(vip, a, sched.n[0]) || !k.ipvs.Schedule(vip, b, sched.n[1]) {
			t.Fatalf("no destinations under %s:\n%s", vip, k.ipvs.Dump())
		}
	}
	check := func(what string, wa, wb uint64) {
		t.Helper()
		got, err := k.p.Counts()
		if err != nil {
			t.Fatal(err)
		}
		want := map[netip.AddrPort]uint64{a: wa, b: wb}
		if len(got) != 2 {
			t.Fatalf("%s: %+v", what, got)
		}
		for _, c := range got {
			if c.Service != "demo/web:p" || c.Protocol != dataplane.TCP || c.NewConnections != want[c.Endpoint] {
				t.Errorf("%s: %+v, want %d", what, c, want[c.Endpoint])
			}
		}
	}
	check("after traffic", 11, 99)
	web.Detach() // the record shares the synced Backends
	web.Backends[0].Weight = 50
	k.sync(t, state(web), false)
	check("after a weight change", 11, 99)
}
