package gateway

import (
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
)

// TestRoutesInDataplanes: the State of a Gateway listener and of a
// Service-parent route, programmed into the iptables fake kernel (shares
// read back by its rule parser) and the IPVS fake (shares from its
// destinations' weights): both show the route's shares with no dataplane
// change. nftables is covered on a real kernel by test/gateway.
func TestRoutesInDataplanes(t *testing.T) {
	svcs := []*corev1.Service{
		svc("s1", "198.18.0.10", map[string]string{controller.AnnotationWeights: "a=1,b=3"}),
		svc("s2", "198.18.0.11", nil),
		svc("front", "198.18.0.12", nil),
	}
	slices := []*discoveryv1.EndpointSlice{
		slice("s1", map[string]string{"a": "198.19.1.2", "b": "198.19.1.3"}),
		slice("s2", map[string]string{"c": "198.19.1.4"}),
	}
	gamma := tcpRoute("canary", 1, gwv1.ParentReference{Group: ptrGroup(""), Kind: ptrKind("Service"), Name: "front"}, backendRef("s1", 1), backendRef("s2", 3))
	res := Translate(Input{
		Classes:   []*gwv1.GatewayClass{class()},
		Gateways:  []*gwv1.Gateway{gw("gw", 0, gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000})},
		TCPRoutes: []*gwv1.TCPRoute{tcpRoute("web", 0, gwv1.ParentReference{Name: "gw"}, backendRef("s1", 80), backendRef("s2", 20)), gamma},
		Services:  svcs,
		Pool:      netip.MustParsePrefix("198.18.200.0/28"),
	})
	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, _ := b.Build(svcs, slices)
	want := map[string]map[string]float64{
		"198.18.200.1:9000": {"198.19.1.2": 20, "198.19.1.3": 60, "198.19.1.4": 20},
		// 1:3 across s1 (itself 1:3) and s2.
		"198.18.0.12:80": {"198.19.1.2": 6.25, "198.19.1.3": 18.75, "198.19.1.4": 75},
	}

	ipt := iptables.NewProxier(iptables.NewFake(), iptables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}})
	check(t, "iptables", ipt, st, want)

	dir := t.TempDir()
	for _, sc := range ipvs.Sysctls {
		path := filepath.Join(dir, strings.ReplaceAll(sc.Name, ".", "/"))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ip := ipvs.NewProxier(ipvs.NewFake(), ipvs.NewFakeLinks(), ipvs.NewFakeSets(), iptables.NewFake(),
		ipvs.Config{SysctlDir: dir, Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}})
	check(t, "ipvs", ip, st, want)
}

func check(t *testing.T, name string, d dataplane.Dataplane, st dataplane.State, want map[string]map[string]float64) {
	t.Helper()
	if _, err := d.Sync(st, dataplane.FullSync); err != nil {
		t.Fatalf("%s: sync: %v", name, err)
	}
	views, err := d.Explain()
	if err != nil {
		t.Fatalf("%s: explain: %v", name, err)
	}
	for vip, shares := range want {
		ap := netip.MustParseAddrPort(vip)
		var v *dataplane.ServiceView
		for i := range views {
			if views[i].VIP == ap.Addr().String() && views[i].Port == ap.Port() && views[i].Protocol == dataplane.TCP && views[i].Entry != dataplane.EntryNodePort {
				v = &views[i]
			}
		}
		if v == nil {
			t.Errorf("%s: no view of %s", name, vip)
			continue
		}
		got := map[string]float64{}
		for _, be := range v.Backends {
			got[be.IP] += be.Share
		}
		for ip, w := range shares {
			// IPVS weights are integers: allow its rounding, 0.1 point.
			if math.Abs(got[ip]-w) > 0.1 {
				t.Errorf("%s: %s (%s) shares %v, want %v", name, vip, v.Service, got, shares)
				break
			}
		}
		t.Logf("%s: %s %s %v", name, v.Service, vip, got)
	}
}

func ptrGroup(s string) *gwv1.Group { g := gwv1.Group(s); return &g }
func ptrKind(s string) *gwv1.Kind   { k := gwv1.Kind(s); return &k }
