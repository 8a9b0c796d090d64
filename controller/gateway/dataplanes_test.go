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
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
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

	check(t, "ipvs", newIPVS(t, dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}), st, want)
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

// TestInvalidBackendKeepsShare: a TCPRoute whose backendRefs are one valid
// Service (weight 3) and three invalid ones (a missing Service, another
// namespace without a ReferenceGrant, a wrong kind; weight 1 each) keeps
// half of the new connections for the invalid ones and refuses them, as the
// spec requires, instead of handing them to the valid backend. The iptables
// packet tracer (nat, then filter for what nat left) is the oracle; every
// dataplane's explain must agree with the desired state (verify).
func TestInvalidBackendKeepsShare(t *testing.T) {
	svcs := []*corev1.Service{svc("s1", "198.18.0.10", nil)}
	slices := []*discoveryv1.EndpointSlice{slice("s1", map[string]string{"a": "198.19.1.2", "b": "198.19.1.3"})}
	other := backendRef("s1", 1)
	other.Namespace = ptr.To[gwv1.Namespace]("elsewhere")
	kind := backendRef("s1", 1)
	kind.Kind = ptr.To[gwv1.Kind]("ConfigMap")
	res := Translate(Input{
		Classes:   []*gwv1.GatewayClass{class()},
		Gateways:  []*gwv1.Gateway{gw("gw", 0, gwv1.Listener{Name: "tcp", Protocol: gwv1.TCPProtocolType, Port: 9000})},
		TCPRoutes: []*gwv1.TCPRoute{tcpRoute("web", 0, gwv1.ParentReference{Name: "gw"}, backendRef("s1", 3), backendRef("missing", 1), other, kind)},
		Services:  svcs,
		Pool:      netip.MustParsePrefix("198.18.200.0/28"),
	})
	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, _ := b.Build(svcs, slices)
	cfg := dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}

	// The tracer: a new connection from a pod to the listener.
	f := iptables.NewFake()
	if _, err := iptables.NewProxier(f, iptables.Config{Masquerade: cfg}).Sync(st, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	rs := f.Ruleset()
	// From a pod and from off the cluster (masqueraded: the nat table
	// marks the packet before the split, so the filter table sees the
	// mark on the share it must refuse).
	for _, src := range []string{"198.19.1.9", "198.19.254.2"} {
		p := iptables.Packet{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("198.18.200.1"), Protocol: "tcp", DPort: 9000}
		nat, err := rs.Trace(iptables.TableNAT, "PREROUTING", p)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, o := range nat {
			if o.Verdict == "DNAT" {
				got[o.DNAT.Addr().String()] += 100 * o.Probability
				continue
			}
			// Not DNATed: what the filter table does with it, carrying
			// the mark nat left.
			fp := p
			fp.Mark = o.Mark
			filter, err := rs.Trace(iptables.TableFilter, "FORWARD", fp)
			if err != nil {
				t.Fatal(err)
			}
			for _, fo := range filter {
				got[fo.Verdict] += 100 * o.Probability * fo.Probability
			}
		}
		sameShares(t, "traced from "+src, got, map[string]float64{"198.19.1.2": 25, "198.19.1.3": 25, "REJECT": 50})
	}

	// Each dataplane shows the same shares and the reject share, and
	// agrees with the desired state.
	for _, d := range []struct {
		name string
		dp   dataplane.Dataplane
	}{
		{"iptables", iptables.NewProxier(iptables.NewFake(), iptables.Config{Masquerade: cfg})},
		{"ipvs", newIPVS(t, cfg)},
		{"nftables", nftables.NewProxier(knftables.NewFake(knftables.IPv4Family, nftables.TableName), nftables.Config{Masquerade: cfg})},
	} {
		if _, err := d.dp.Sync(st, dataplane.FullSync); err != nil {
			t.Fatalf("%s: sync: %v", d.name, err)
		}
		views, err := d.dp.Explain()
		if err != nil {
			t.Fatalf("%s: explain: %v", d.name, err)
		}
		if diff := dataplane.Diff(dataplane.Expected(st), views); len(diff) > 0 {
			t.Errorf("%s: kernel and desired state differ:\n%s", d.name, strings.Join(diff, "\n"))
		}
		for _, v := range views {
			if v.VIP == "198.18.200.1" {
				if math.Abs(v.RejectShare-50) > 0.01 || len(v.Backends) != 2 {
					t.Errorf("%s: %s", d.name, v.Line())
				}
				t.Logf("%s: %s", d.name, v.Line())
			}
		}
	}
}

func newIPVS(t *testing.T, m dataplane.Masquerade) *ipvs.Proxier {
	t.Helper()
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
	return ipvs.NewProxier(ipvs.NewFake(), ipvs.NewFakeLinks(), ipvs.NewFakeSets(), iptables.NewFake(), ipvs.Config{SysctlDir: dir, Masquerade: m})
}
