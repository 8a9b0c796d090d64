package main

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/ebpf"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// A dual-stack Service: one IPv4 and one IPv6 clusterIP, an endpoint each.
func dualStackObjects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"},
		Spec: corev1.ServiceSpec{
			ClusterIP: "198.18.0.10", ClusterIPs: []string{"198.18.0.10", "2001:2::10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	port, pname, proto := int32(8080), "http", corev1.ProtocolTCP
	slice := func(name string, at discoveryv1.AddressType, ip string) *discoveryv1.EndpointSlice {
		ready := true
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: at,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
		}
	}
	return []*corev1.Service{svc}, []*discoveryv1.EndpointSlice{
		slice("web-4", discoveryv1.AddressTypeIPv4, "198.19.1.2"),
		slice("web-6", discoveryv1.AddressTypeIPv6, "2001:2::1:2"),
	}
}

// fakeMode is one mode of the table over fake kernels with both IP
// families, and a way to break its kernel state behind its back (so that
// it goes full on its own); nil when the mode has none yet.
type fakeMode struct {
	open  func(t *testing.T) *dataplane.DualStack
	flush func(t *testing.T)
}

func fakeModes() map[string]*fakeMode {
	out := map[string]*fakeMode{}
	ipt4 := iptables.NewFake()
	out["iptables"] = &fakeMode{
		open: func(*testing.T) *dataplane.DualStack {
			return iptables.NewDualStack(ipt4, iptables.NewFake(), iptables.Config{})
		},
		flush: func(*testing.T) { ipt4.FlushTable(iptables.TableNAT); ipt4.FlushTable(iptables.TableFilter) },
	}
	k, links := ipvs.NewFake(), ipvs.NewFakeLinks()
	out["ipvs"] = &fakeMode{
		open: func(t *testing.T) *dataplane.DualStack {
			return ipvs.NewDualStack(k, links, ipvs.NewFakeSets(), iptables.NewFake(), iptables.NewFake(),
				ipvs.Config{SysctlDir: ipvsSysctls(t)})
		},
		// The interface with its VIPs: an IPVS-only flush (ipvsadm -C) is
		// repaired by a partial sync that re-adds the virtual servers.
		flush: func(t *testing.T) {
			if err := links.DeleteDummy(ipvs.DefaultInterface); err != nil {
				t.Fatal(err)
			}
		},
	}
	out["nftables"] = &fakeMode{
		open: func(*testing.T) *dataplane.DualStack {
			return nftables.NewDualStack(knftables.NewFake(knftables.IPv4Family, nftables.TableName),
				knftables.NewFake(knftables.IPv6Family, nftables.TableName), nftables.Config{})
		},
	}
	out["ebpf"] = &fakeMode{
		open: func(t *testing.T) *dataplane.DualStack {
			return ebpf.NewDualStackMem(out["nftables"].open(t), false)
		},
	}
	return out
}

// ipvsSysctls returns a sysctl tree with the files the IPVS mode writes.
func ipvsSysctls(t *testing.T) string {
	dir := t.TempDir()
	for _, sc := range append(slices.Clone(ipvs.Sysctls), ipvs.Sysctls6...) {
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

type staticSource struct {
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
}

func (s staticSource) Load() ([]*corev1.Service, []*discoveryv1.EndpointSlice, []error) {
	return s.svcs, s.slices, nil
}

func metric(t *testing.T, m *controller.Metrics, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}

// The wiring of run, for every mode of the table: the agent behind the
// health-check wrapper programs IPv6 Service ports when the node has IPv6
// (issue 11: nftables never got them), and a sync the dataplane turned
// full on its own is counted as full (issue 11: the wrapper hid it).
func TestWiringEveryMode(t *testing.T) {
	prev := setIPv6Forwarding
	setIPv6Forwarding = func(string) error { return nil } // not in a test namespace
	defer func() { setIPv6Forwarding = prev }()
	fakes := fakeModes()
	svcs, slices := dualStackObjects()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			fm := fakes[m.name]
			if fm == nil {
				t.Fatalf("mode %s has no fake kernel in this test", m.name)
			}
			d := fm.open(t)
			metrics := controller.NewMetrics()
			clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
			agent := &controller.Agent{Source: staticSource{svcs, slices}, Builder: controller.NewBuilder(),
				Dataplane: d, FullSyncPeriod: time.Hour, Clock: clk, Metrics: metrics}
			var node nodeFlags
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := node.setupParity(ctx, agent, d, &nodeAddressSource{}, "", t.TempDir(), "node-a", func() {}); err != nil {
				t.Fatal(err)
			}
			sync := func() {
				t.Helper()
				clk.Step(30 * time.Second)
				if err := agent.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			sync()
			views, err := d.Explain()
			if err != nil {
				t.Fatal(err)
			}
			keys := map[string]bool{}
			for _, v := range views {
				keys[v.Key()] = true
			}
			for _, k := range []string{"198.18.0.10:80/TCP", "[2001:2::10]:80/TCP"} {
				if !keys[k] {
					t.Errorf("explain lacks %s: %v", k, keys)
				}
			}
			sync()
			if full, partial := metric(t, metrics, "steelyard_sync_full_proxy_rules_duration_seconds_count"),
				metric(t, metrics, "steelyard_sync_partial_proxy_rules_duration_seconds_count"); full != "1" || partial != "1" {
				t.Errorf("syncs counted full %s, partial %s; want 1 and 1", full, partial)
			}
			if fm.flush == nil {
				t.Logf("mode %s: no way to flush its fake kernel; full-on-its-own not checked", m.name)
				return
			}
			fm.flush(t)
			sync() // asked partial; the dataplane finds its state gone
			if full := metric(t, metrics, "steelyard_sync_full_proxy_rules_duration_seconds_count"); full != "2" {
				t.Errorf("a sync that went full on its own counted as partial (full count %s, want 2)", full)
			}
		})
	}
}

// verify builds IPv6 Service ports for every mode with IPv6 too.
func TestVerifyBuilderIPv6EveryMode(t *testing.T) {
	svcs, slices := dualStackObjects()
	fakes := fakeModes()
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			var node nodeFlags
			b, _ := node.builder(context.Background(), fakes[m.name].open(t), "", t.TempDir(), "node-a")
			state, _ := b.Build(svcs, slices)
			v6 := 0
			for _, sp := range state.Services {
				if sp.Family() == 6 {
					v6++
				}
			}
			if v6 != 1 {
				t.Errorf("%d IPv6 Service ports built, want 1", v6)
			}
		})
	}
}

// run, explain, verify and cleanup share one table of modes: an unknown
// mode is refused with the table's names, before anything is opened.
func TestUnknownModeRefused(t *testing.T) {
	f := dataplaneFlags{mode: "bpf"}
	if _, err := f.open(nil); err == nil || !strings.Contains(err.Error(), "want iptables, ipvs, nftables or ebpf") {
		t.Errorf("open --mode bpf: %v", err)
	}
	if _, err := lookupMode("bpf"); err == nil {
		t.Error("cleanup --mode bpf accepted")
	}
	bad := dataplaneFlags{mode: "iptables", masqueradeBit: 32}
	if _, err := bad.open(nil); err == nil || !strings.Contains(err.Error(), "--masquerade-bit") {
		t.Errorf("open --masquerade-bit 32: %v", err)
	}
}

// --localhost-nodeports as kube-proxy reads it: only in the modes that
// serve it, and not when --nodeport-addresses leaves 127.0.0.1 out.
func TestLocalhostNodePortsDecision(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		flag  bool
		cidrs []string
		want  bool
	}{
		{"iptables", true, nil, true},
		{"nftables", true, nil, true},
		{"ipvs", true, nil, false},
		{"iptables", false, nil, false},
		{"iptables", true, []string{"198.19.0.0/16"}, false},
		{"nftables", true, []string{"198.19.0.0/16", "127.0.0.0/8"}, true},
	} {
		dp := &dataplaneFlags{mode: tc.mode, localhostNodePorts: tc.flag}
		if got := localhostNodePorts(dp, &nodeFlags{nodePortAddresses: tc.cidrs}); got != tc.want {
			t.Errorf("mode %s, flag %v, --nodeport-addresses %v: %v, want %v", tc.mode, tc.flag, tc.cidrs, got, tc.want)
		}
	}
}

func TestSetRouteLocalnet(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "net/ipv4/conf/all/route_localnet")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := setRouteLocalnet(dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("route_localnet = %q, want 1", b)
	}
	if err := setRouteLocalnet(t.TempDir()); err == nil || !strings.Contains(err.Error(), "--localhost-nodeports=false") {
		t.Errorf("missing sysctl: %v, want an error naming the way out", err)
	}
}

// On by default, a read-only route_localnet turns localhost node ports off
// with a warning; asked for with the flag, it is an error.
func TestLocalhostNodePortsReadOnlySysctl(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "net/ipv4/conf/all/route_localnet")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	// Read-only for root too: a 0444 sysctl (the kernel's own permission
	// check, which CAP_DAC_OVERRIDE does not pass), reached by a link, as a
	// read-only /proc/sys would be. Nothing is written: the open fails.
	if err := os.Symlink("/proc/sys/kernel/osrelease", p); err != nil {
		t.Fatal(err)
	}
	dp := &dataplaneFlags{mode: "iptables", localhostNodePorts: true, sysctlDir: dir}
	if err := checkLocalhostNodePorts(dp, false); err != nil || dp.localhostNodePorts {
		t.Errorf("default: err %v, on %v; want no error and off", err, dp.localhostNodePorts)
	}
	dp.localhostNodePorts = true
	if err := checkLocalhostNodePorts(dp, true); err == nil {
		t.Error("explicit --localhost-nodeports with a read-only sysctl: no error")
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dp.localhostNodePorts = true
	if err := checkLocalhostNodePorts(dp, true); err != nil || !dp.localhostNodePorts {
		t.Errorf("route_localnet already 1: err %v, on %v", err, dp.localhostNodePorts)
	}
}
