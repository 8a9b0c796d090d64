package ipvs

import (
	stdmaps "maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/internal/iptables"
)

// Dual-stack test plan: IPv4 as in proxier_test.go; IPv6 only from the
// benchmarking range 2001:2::/48: VIPs 2001:2::/64, pods 2001:2:0:1::/64,
// the node 2001:2:0:fe::1.

type dualKernel struct {
	testKernel
	ipt6 *iptables.Fake
	d    *dataplane.DualStack
}

func newDualKernel(t *testing.T) *dualKernel {
	k := &dualKernel{testKernel: *newTestKernel(t), ipt6: iptables.NewFake()}
	for _, sc := range Sysctls6 {
		path := filepath.Join(k.cfg.SysctlDir, strings.ReplaceAll(sc.Name, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	k.sets.Referenced = func(name string) bool {
		s4, _ := k.ipt.SaveAll()
		s6, _ := k.ipt6.SaveAll()
		return strings.Contains(string(s4), name+" ") || strings.Contains(string(s6), name+" ")
	}
	k.cfg.ClusterCIDRs = append(k.cfg.ClusterCIDRs, netip.MustParsePrefix("2001:2:0:1::/64"))
	k.cfg.NodeAddresses = nodeAddrs("198.19.0.1", "2001:2:0:fe::1", "fe80::1", "::1")
	k.restart()
	return k
}

func (k *dualKernel) restart() { k.d = NewDualStack(k.ipvs, k.links, k.sets, k.ipt, k.ipt6, k.cfg) }

func (k *dualKernel) sync(t *testing.T, s dataplane.State, full bool) {
	t.Helper()
	if _, err := k.d.Sync(s, dataplane.SyncRequest{Full: full}); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// dualState: one dual-stack Service (10/90 in both families, node port
// 30080) and an IPv6-only one.
func dualState() dataplane.State {
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2:8080", 10), be("198.19.1.3:8080", 90))
	web.NodePort = 30080
	web6 := svc("web", "2001:2::10", 80, dataplane.TCP, be("[2001:2:0:1::2]:8080", 10), be("[2001:2:0:1::3]:8080", 90))
	web6.NodePort = 30080
	dns6 := svc("dns", "2001:2::53", 53, dataplane.UDP, be("[2001:2:0:1::4]:5353", 1), be("[2001:2:0:1::5]:5353", 3))
	return state(web, web6, dns6)
}

func TestDualStackSync(t *testing.T) {
	k := newDualKernel(t)
	st := dualState()
	k.sync(t, st, true)
	dump := k.ipvs.Dump()
	for _, want := range []string{
		"TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 10\n  -> 198.19.1.3:8080 90\n",
		"TCP 198.19.0.1:30080 wrr\n  -> 198.19.1.2:8080 10\n  -> 198.19.1.3:8080 90\n",
		"TCP [2001:2::10]:80 wrr\n  -> [2001:2:0:1::2]:8080 10\n  -> [2001:2:0:1::3]:8080 90\n",
		"UDP [2001:2::53]:53 wrr\n  -> [2001:2:0:1::4]:5353 1\n  -> [2001:2:0:1::5]:5353 3\n",
		"TCP [2001:2:0:fe::1]:30080 wrr\n  -> [2001:2:0:1::2]:8080 10\n  -> [2001:2:0:1::3]:8080 90\n",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("IPVS table lacks\n%s\n%s", want, dump)
		}
	}
	if strings.Contains(dump, "fe80") || strings.Contains(dump, "[::1]") || strings.Count(dump, ":30080 ") != 2 {
		t.Errorf("node port on a link-local or loopback address, or missing:\n%s", dump)
	}
	addrs, _ := k.links.Addresses(DefaultInterface)
	want := []netip.Addr{netip.MustParseAddr("198.18.0.10"), netip.MustParseAddr("2001:2::10"), netip.MustParseAddr("2001:2::53")}
	if !slices.Equal(addrs, want) {
		t.Errorf("%s addresses = %v, want %v", DefaultInterface, addrs, want)
	}
	// Each family has its own sets (inet6 for IPv6; the fake rejects an
	// address of the wrong family) and its own rules.
	v6, _ := k.sets.Entries(SetName(6, SetVIPs))
	if w := []SetEntry{{"2001:2::10,tcp:80", "demo/web:p"}, {"2001:2::53,udp:53", "demo/dns:p"}}; !slices.Equal(v6, w) {
		t.Errorf("%s = %v, want %v", SetName(6, SetVIPs), v6, w)
	}
	v4, _ := k.sets.Entries(SetVIPs)
	if w := []SetEntry{{"198.18.0.10,tcp:80", "demo/web:p"}}; !slices.Equal(v4, w) {
		t.Errorf("%s = %v, want %v", SetVIPs, v4, w)
	}
	ext6, _ := k.sets.Entries(SetName(6, SetExternal))
	if w := []SetEntry{{"2001:2:0:fe::1,tcp:30080", "demo/web:p|nodePort"}}; !slices.Equal(ext6, w) {
		t.Errorf("%s = %v, want %v", SetName(6, SetExternal), ext6, w)
	}
	r4, _ := k.ipt.SaveAll()
	r6, _ := k.ipt6.SaveAll()
	if strings.Contains(string(r4), "IPVS6") || strings.Contains(string(r4), "2001:2") {
		t.Errorf("iptables holds IPv6 sets or ranges:\n%s", r4)
	}
	for _, w := range []string{"--match-set STEELYARD-IPVS6-VIPS dst,dst", "-s 2001:2:0:1::/64", "--match-set STEELYARD-IPVS6-LOOP dst,dst,src"} {
		if !strings.Contains(string(r6), w) {
			t.Errorf("ip6tables lacks %q:\n%s", w, r6)
		}
	}
	if strings.Contains(string(r6), "198.19.0.0/16") {
		t.Errorf("ip6tables holds the IPv4 cluster CIDR:\n%s", r6)
	}

	// explain shows both families, and agrees with the desired state.
	views, err := k.d.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(st), views); len(diff) != 0 {
		t.Errorf("explain differs from the desired state:\n%s", strings.Join(diff, "\n"))
	}
	var b strings.Builder
	_ = dataplane.WriteViews(&b, views, "text")
	for _, w := range []string{
		"198.18.0.10:80/TCP  198.19.1.2:8080 10.00%  198.19.1.3:8080 90.00%  demo/web:p",
		"[2001:2::10]:80/TCP  [2001:2:0:1::2]:8080 10.00%  [2001:2:0:1::3]:8080 90.00%  demo/web:p",
		"[::]:30080/TCP  [2001:2:0:1::2]:8080 10.00%  [2001:2:0:1::3]:8080 90.00%  demo/web:p  [nodePort, on 2001:2:0:fe::1, policy Cluster]",
		"0.0.0.0:30080/TCP  198.19.1.2:8080 10.00%  198.19.1.3:8080 90.00%  demo/web:p  [nodePort, on 198.19.0.1, policy Cluster]",
	} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("explain lacks\n%s\n%s", w, b.String())
		}
	}

	// A full Sync of one family never touches the other: each sees only
	// its own virtual servers and VIPs.
	writes := k.ipvs.Writes
	k.sync(t, st, true)
	k.sync(t, st, false)
	k.restart()
	k.sync(t, st, true)
	if k.ipvs.Writes != writes {
		t.Errorf("%d writes re-syncing and restarting with the same state", k.ipvs.Writes-writes)
	}

	// A change in one family: only its destinations are written.
	st6 := dualState()
	for i := range st6.Services {
		if st6.Services[i].VIP.IP == netip.MustParseAddr("2001:2::10") {
			st6.Services[i].Backends[0].Weight, st6.Services[i].Backends[1].Weight = 30, 70
		}
	}
	before := stdmaps.Clone(k.ipvs.DestWrites)
	k.sync(t, st6, false)
	for key, n := range k.ipvs.DestWrites {
		if n != before[key] && !strings.Contains(key, "2001:2:0:1::") {
			t.Errorf("%s written by an IPv6 change", key)
		}
	}
	if !strings.Contains(k.ipvs.Dump(), "TCP [2001:2::10]:80 wrr\n  -> [2001:2:0:1::2]:8080 30\n  -> [2001:2:0:1::3]:8080 70\n") {
		t.Errorf("IPv6 weights not updated:\n%s", k.ipvs.Dump())
	}

	// Removing the IPv6 Services leaves IPv4 alone, and the IPv6 VIPs go.
	v4only, _ := dataplane.SplitFamilies(st)
	k.sync(t, v4only, true)
	if d := k.ipvs.Dump(); strings.Contains(d, "2001:2") || !strings.Contains(d, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 10\n") {
		t.Errorf("after removing IPv6:\n%s", d)
	}
	if addrs, _ := k.links.Addresses(DefaultInterface); !slices.Equal(addrs, []netip.Addr{netip.MustParseAddr("198.18.0.10")}) {
		t.Errorf("%s addresses = %v, want the IPv4 VIP only", DefaultInterface, addrs)
	}
}

// Cleanup removes both families' virtual servers, rules and sets and the
// dummy interface; a virtual server of someone else stays.
func TestDualStackCleanup(t *testing.T) {
	k := newDualKernel(t)
	k.sync(t, dualState(), true)
	other := VirtualServer{Address: netip.MustParseAddr("2001:2:0:99::1"), Port: 80, Protocol: dataplane.TCP, Scheduler: "rr"}
	if err := k.ipvs.AddVirtualServer(other); err != nil {
		t.Fatal(err)
	}
	if err := k.d.Cleanup(); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if d := k.ipvs.Dump(); d != "TCP [2001:2:0:99::1]:80 rr\n" {
		t.Errorf("after cleanup the table is\n%s\nwant only the foreign virtual server", d)
	}
	if k.links.Exists(DefaultInterface) {
		t.Errorf("%s left after cleanup", DefaultInterface)
	}
	for _, st := range setTypes {
		for _, f := range []int{4, 6} {
			if k.sets.Exists(SetName(f, st.name)) {
				t.Errorf("set %s left after cleanup", SetName(f, st.name))
			}
		}
	}
	for _, ipt := range []*iptables.Fake{k.ipt, k.ipt6} {
		if saved, _ := ipt.SaveAll(); strings.Contains(string(saved), "STEELYARD") {
			t.Errorf("rules left after cleanup:\n%s", saved)
		}
	}
}

// Without ip6tables, IPv6 Service ports are left out and IPv4 still syncs.
func TestDualStackIPv4Only(t *testing.T) {
	k := newDualKernel(t)
	k.d = NewDualStack(k.ipvs, k.links, k.sets, k.ipt, nil, k.cfg)
	k.sync(t, dualState(), true)
	if d := k.ipvs.Dump(); strings.Contains(d, "2001:2") || !strings.Contains(d, "198.18.0.10:80") {
		t.Errorf("IPv4-only table:\n%s", d)
	}
}
