package dataplane

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// familyFake is a per-family dataplane that keeps what it was given.
type familyFake struct {
	family  int
	applied State
	req     SyncRequest
	res     SyncResult
	err     error
	cleaned *[]int
}

func (f *familyFake) Sync(s State, req SyncRequest) (SyncResult, error) {
	if f.err != nil {
		return SyncResult{}, f.err
	}
	f.applied, f.req = s, req
	return f.res, nil
}

func (f *familyFake) Explain() ([]ServiceView, error) {
	var out []ServiceView
	for _, sp := range f.applied.Services {
		out = append(out, ServiceView{Service: sp.Name.String(), VIP: sp.VIP.IP.String(), Port: sp.VIP.Port, Protocol: sp.VIP.Protocol})
	}
	return out, nil
}

func (f *familyFake) Cleanup() error { *f.cleaned = append(*f.cleaned, f.family); return nil }

func port(ns, name, vip string) ServicePort {
	return ServicePort{Name: ServicePortName{Namespace: ns, Name: name, Port: "http"}, VIP: VIP{IP: netip.MustParseAddr(vip), Port: 80, Protocol: TCP}}
}

func TestDualStackSplitsFamiliesAndMergesResults(t *testing.T) {
	var cleaned []int
	v4 := &familyFake{family: 4, cleaned: &cleaned, res: SyncResult{Full: true}}
	v6 := &familyFake{family: 6, cleaned: &cleaned, res: SyncResult{RequeueAfter: time.Second}}
	d := NewDualStack(v4, v6)
	if !d.IPv6() {
		t.Fatal("IPv6() false with an IPv6 dataplane")
	}
	req := SyncRequest{Changed: map[ServiceName]bool{{Namespace: "demo", Name: "web"}: true}}
	s := State{Services: []ServicePort{port("demo", "web", "198.18.0.10"), port("demo", "web", "2001:2::10"), port("demo", "api", "2001:2::11")}}
	res, err := d.Sync(s, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(v4.applied.Services) != 1 || len(v6.applied.Services) != 2 {
		t.Errorf("IPv4 got %d ports, IPv6 %d; want 1 and 2", len(v4.applied.Services), len(v6.applied.Services))
	}
	if !v6.req.MayHaveChanged(ServicePortName{Namespace: "demo", Name: "web", Port: "http"}) || v6.req.MayHaveChanged(ServicePortName{Namespace: "demo", Name: "api", Port: "http"}) {
		t.Errorf("the changed set did not reach the IPv6 dataplane: %+v", v6.req)
	}
	if res != (SyncResult{Full: true, RequeueAfter: time.Second}) {
		t.Errorf("result %+v, want full (IPv4) and requeue after 1s (IPv6)", res)
	}
	views, err := d.Explain()
	if err != nil || len(views) != 3 {
		t.Errorf("explain: %d views, %v", len(views), err)
	}
	if err := d.Cleanup(); err != nil || len(cleaned) != 2 || cleaned[0] != 6 {
		t.Errorf("cleanup order %v (%v), want IPv6 then IPv4", cleaned, err)
	}

	// A failing family is reported by name; the other one is applied.
	v6.err = errors.New("restore failed")
	s.Services[0].Backends = []Backend{{IP: netip.MustParseAddr("198.19.1.2"), Port: 8080, Weight: 1}}
	if _, err := d.Sync(s, FullSync); err == nil || !strings.Contains(err.Error(), "IPv6: restore failed") {
		t.Errorf("error %v, want the IPv6 one", err)
	}
	if len(v4.applied.Services[0].Backends) != 1 {
		t.Error("the IPv4 half was not applied")
	}
}

func TestDualStackIPv4Only(t *testing.T) {
	var cleaned []int
	v4 := &familyFake{family: 4, cleaned: &cleaned}
	d := NewDualStack(v4, nil)
	if d.IPv6() {
		t.Fatal("IPv6() true without an IPv6 dataplane")
	}
	if _, err := d.Sync(State{Services: []ServicePort{port("demo", "web", "198.18.0.10"), port("demo", "web", "2001:2::10")}}, FullSync); err != nil {
		t.Fatal(err)
	}
	if len(v4.applied.Services) != 1 {
		t.Errorf("IPv4 got %d ports, want 1", len(v4.applied.Services))
	}
	if _, err := d.Explain(); err != nil {
		t.Fatal(err)
	}
	if err := d.Cleanup(); err != nil || len(cleaned) != 1 {
		t.Errorf("cleanup %v %v", cleaned, err)
	}
}

func TestMergeKeepsSoonerRequeue(t *testing.T) {
	for _, tc := range []struct{ a, b, want time.Duration }{{0, 0, 0}, {0, 2, 2}, {3, 0, 3}, {3, 2, 2}} {
		if got := (SyncResult{RequeueAfter: tc.a}).Merge(SyncResult{RequeueAfter: tc.b}).RequeueAfter; got != tc.want {
			t.Errorf("merge %v %v = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParseMasquerade(t *testing.T) {
	m, err := ParseMasquerade([]string{"198.19.0.7/16", "", "2001:2:0:1::/64"}, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.CIDRs(4); len(got) != 1 || got[0].String() != "198.19.0.0/16" {
		t.Errorf("IPv4 CIDRs %v", got)
	}
	if got := m.CIDRs(6); len(got) != 1 {
		t.Errorf("IPv6 CIDRs %v", got)
	}
	if m.Mark() != "0x2000" {
		t.Errorf("default mark %s, want 0x2000", m.Mark())
	}
	for _, bad := range []struct {
		cidrs []string
		bit   int
	}{{nil, 32}, {nil, -1}, {[]string{"nonsense"}, 0}} {
		if _, err := ParseMasquerade(bad.cidrs, false, bad.bit); err == nil {
			t.Errorf("%v bit %d accepted", bad.cidrs, bad.bit)
		}
	}
}

func (f *familyFake) Counts() ([]EndpointCount, error) { return nil, nil }

// SplitFamilies keeps the order of each family; a State of one family
// comes back without a copy (the same array).
func TestSplitFamilies(t *testing.T) {
	mixed := State{Services: []ServicePort{port("a", "x", "198.18.0.1"), port("a", "y", "2001:2::1"),
		port("b", "x", "198.18.0.2"), port("b", "y", "2001:2::2")}}
	v4, v6 := SplitFamilies(mixed)
	names := func(s State) string {
		var out []string
		for _, sp := range s.Services {
			out = append(out, sp.Name.String())
		}
		return strings.Join(out, " ")
	}
	if got := names(v4); got != "a/x:http b/x:http" {
		t.Errorf("v4: %s", got)
	}
	if got := names(v6); got != "a/y:http b/y:http" {
		t.Errorf("v6: %s", got)
	}
	only4 := State{Services: []ServicePort{port("a", "x", "198.18.0.1"), port("b", "x", "198.18.0.2")}}
	v4, v6 = SplitFamilies(only4)
	if len(v6.Services) != 0 || len(v4.Services) != 2 || &v4.Services[0] != &only4.Services[0] {
		t.Errorf("IPv4 only: copied or split (%d, %d)", len(v4.Services), len(v6.Services))
	}
	only6 := State{Services: []ServicePort{port("a", "y", "2001:2::1")}}
	v4, v6 = SplitFamilies(only6)
	if len(v4.Services) != 0 || len(v6.Services) != 1 || &v6.Services[0] != &only6.Services[0] {
		t.Errorf("IPv6 only: copied or split (%d, %d)", len(v4.Services), len(v6.Services))
	}
}
