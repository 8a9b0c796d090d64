package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
)

// Test IP plan: the bridge cni0 is 198.19.64.1/24, the pod 198.19.64.2
// (and 2001:2::40:2 for dual stack), a VIP 198.18.0.20, a client pod
// 198.19.64.3.
const podNetns = "/run/netns/pod-a"

// fakeHost keeps links, the forwarding sysctl, pod namespaces and a
// conntrack table, and refuses what the kernel refuses (hairpin on an
// interface that is not a bridge port).
type fakeHost struct {
	links      map[string]*fakeLink
	forwarding bool
	pods       map[string]map[string][]netip.Addr // netns -> ifname -> addrs
	ct         *conntrack.Fake
}

type fakeLink struct {
	bridgePort bool
	hairpin    bool
}

func newFakeHost() *fakeHost {
	return &fakeHost{
		links: map[string]*fakeLink{"cni0": {}, "veth1234": {bridgePort: true}, "eth9": {}},
		pods: map[string]map[string][]netip.Addr{
			podNetns: {"eth0": {netip.MustParseAddr("198.19.64.2")}},
		},
		ct: conntrack.NewFake(),
	}
}

func (h *fakeHost) BridgePort(name string) (bool, bool, error) {
	l, ok := h.links[name]
	if !ok {
		return false, false, nil
	}
	return l.bridgePort, true, nil
}

func (h *fakeHost) Hairpin(name string) (bool, error) {
	l, ok := h.links[name]
	if !ok {
		return false, fmt.Errorf("link %s not found", name)
	}
	if !l.bridgePort {
		return false, fmt.Errorf("%s is not a bridge port", name)
	}
	return l.hairpin, nil
}

func (h *fakeHost) SetHairpin(name string, on bool) error {
	l, ok := h.links[name]
	if !ok {
		return fmt.Errorf("link %s not found", name)
	}
	if !l.bridgePort {
		return fmt.Errorf("%s is not a bridge port: operation not supported", name)
	}
	l.hairpin = on
	return nil
}

func (h *fakeHost) Forwarding() (bool, error) { return h.forwarding, nil }
func (h *fakeHost) EnableForwarding() error   { h.forwarding = true; return nil }

func (h *fakeHost) PodAddrs(netns, ifName string) ([]netip.Addr, error) {
	return h.pods[netns][ifName], nil
}

func (h *fakeHost) DeleteFlows(addrs []netip.Addr) (int, error) {
	var fs []conntrack.Filter
	for _, a := range addrs {
		fs = append(fs, conntrack.Filter{Addr: a})
	}
	return h.ct.Delete(fs...)
}

// prevResult returns the bridge plugin's result for the test pod, as that
// spec version writes it.
func prevResult(version string) string {
	ipVersion := ""
	if version == "0.4.0" {
		ipVersion = `"version": "4", `
	}
	return `{
		"cniVersion": "` + version + `",
		"interfaces": [
			{"name": "cni0", "mac": "0a:58:c6:13:40:01"},
			{"name": "veth1234", "mac": "0a:58:c6:13:40:02"},
			{"name": "eth0", "mac": "0a:58:c6:13:40:03", "sandbox": "` + podNetns + `"}
		],
		"ips": [{` + ipVersion + `"interface": 2, "address": "198.19.64.2/24", "gateway": "198.19.64.1"}],
		"routes": [{"dst": "0.0.0.0/0", "gw": "198.19.64.1"}],
		"dns": {"nameservers": ["198.18.0.53"]}
	}`
}

func netConf(version, prev, extra string) []byte {
	s := `{"cniVersion": "` + version + `", "name": "k8s-pod-network", "type": "steelyard-cni"` + extra
	if prev != "" {
		s += `, "prevResult": ` + prev
	}
	return []byte(s + "}")
}

func run(t *testing.T, h Host, cmd string, stdin []byte) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	p := &Plugin{Host: h, Stdout: &o, Stderr: &e}
	args := &skel.CmdArgs{ContainerID: "c1", Netns: podNetns, IfName: "eth0", StdinData: stdin}
	switch cmd {
	case "ADD":
		err = p.Add(args)
	case "DEL":
		err = p.Del(args)
	case "CHECK":
		err = p.Check(args)
	default:
		t.Fatalf("unknown command %s", cmd)
	}
	return o.String(), e.String(), err
}

// cniError asserts err is a CNI error with code and a message containing msg.
func cniError(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a CNI error", err, err)
	}
	if e.Code != code || !strings.Contains(e.Msg, msg) {
		t.Fatalf("CNI error {code %d, msg %q}, want code %d and a message with %q", e.Code, e.Msg, code, msg)
	}
}

func TestAddPassesPrevResultThroughPerVersion(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			h := newFakeHost()
			stdout, _, err := run(t, h, "ADD", netConf(v, prevResult(v), ""))
			if err != nil {
				t.Fatal(err)
			}
			// stdout is the result and nothing else: it parses as one
			// result of the caller's version, equal to the prevResult.
			got, err := create.Create(v, []byte(stdout))
			if err != nil {
				t.Fatalf("stdout is not a %s result: %v\n%s", v, err, stdout)
			}
			if got.Version() != v {
				t.Errorf("result version %s, want %s", got.Version(), v)
			}
			want, err := create.Create(v, []byte(prevResult(v)))
			if err != nil {
				t.Fatal(err)
			}
			g, _ := current.NewResultFromResult(got)
			w, _ := current.NewResultFromResult(want)
			if !reflect.DeepEqual(g, w) {
				t.Errorf("result changed:\n got %+v\nwant %+v", g, w)
			}
			var raw map[string]any
			if err := json.Unmarshal([]byte(stdout), &raw); err != nil || raw["cniVersion"] != v {
				t.Errorf("stdout %q: cniVersion %v, err %v", stdout, raw["cniVersion"], err)
			}
			if !h.links["veth1234"].hairpin {
				t.Error("hairpin is off on the bridge port veth1234")
			}
			if h.links["cni0"].hairpin || h.links["eth9"].hairpin {
				t.Error("hairpin set on an interface that is not the pod's bridge port")
			}
			if !h.forwarding {
				t.Error("ip_forward not enabled")
			}
			// CHECK agrees with what ADD did.
			if _, _, err := run(t, h, "CHECK", netConf(v, prevResult(v), "")); err != nil {
				t.Errorf("CHECK after ADD: %v", err)
			}
		})
	}
}

func TestAddNeedsPrevResult(t *testing.T) {
	h := newFakeHost()
	stdout, _, err := run(t, h, "ADD", netConf("1.1.0", "", ""))
	cniError(t, err, types.ErrInvalidNetworkConfig, "must be chained")
	if stdout != "" {
		t.Errorf("stdout %q on error, want nothing (skel prints the error)", stdout)
	}
	if h.forwarding {
		t.Error("a failed ADD changed the host")
	}
}

func TestBadConfig(t *testing.T) {
	cases := []struct {
		name  string
		stdin string
		code  uint
		msg   string
	}{
		{"not JSON", `{"cniVersion": "1.0.0", `, types.ErrDecodingFailure, "cannot parse the network configuration"},
		{"option of the wrong type", `{"cniVersion": "1.0.0", "type": "steelyard-cni", "hairpin": "yes"}`, types.ErrDecodingFailure, "cannot parse the network configuration"},
		{"no cniVersion", `{"type": "steelyard-cni"}`, types.ErrInvalidNetworkConfig, "no cniVersion"},
		{"bad prevResult", string(netConf("1.0.0", `{"ips": [{"address": "not-an-ip"}]}`, "")), types.ErrDecodingFailure, "prevResult"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := run(t, newFakeHost(), "ADD", []byte(c.stdin))
			cniError(t, err, c.code, c.msg)
		})
	}
}

func TestOptionsDefaultOn(t *testing.T) {
	c, err := ParseConfig(netConf("1.0.0", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if !c.HairpinOn() || !c.ConntrackCleanupOn() {
		t.Errorf("defaults: hairpin %v conntrackCleanup %v, want both on", c.HairpinOn(), c.ConntrackCleanupOn())
	}
	c, err = ParseConfig(netConf("1.0.0", "", `, "hairpin": false, "conntrackCleanup": false`))
	if err != nil {
		t.Fatal(err)
	}
	if c.HairpinOn() || c.ConntrackCleanupOn() {
		t.Errorf("explicit false: hairpin %v conntrackCleanup %v, want both off", c.HairpinOn(), c.ConntrackCleanupOn())
	}
}

func TestHairpinOff(t *testing.T) {
	h := newFakeHost()
	conf := netConf("1.0.0", prevResult("1.0.0"), `, "hairpin": false`)
	if _, _, err := run(t, h, "ADD", conf); err != nil {
		t.Fatal(err)
	}
	if h.links["veth1234"].hairpin {
		t.Error(`"hairpin": false still turned hairpin on`)
	}
	if _, _, err := run(t, h, "CHECK", conf); err != nil {
		t.Errorf("CHECK with hairpin off: %v", err)
	}
}

func TestRoutedMainPluginHasNoBridgePort(t *testing.T) {
	// ptp reports a host veth that is not enslaved to a bridge: nothing to
	// set, and ADD succeeds.
	h := newFakeHost()
	prev := `{"cniVersion": "1.0.0", "interfaces": [{"name": "eth9"}, {"name": "eth0", "sandbox": "` + podNetns + `"}],
		"ips": [{"interface": 1, "address": "198.19.64.2/32"}]}`
	if _, _, err := run(t, h, "ADD", netConf("1.0.0", prev, "")); err != nil {
		t.Fatal(err)
	}
	if h.links["eth9"].hairpin {
		t.Error("hairpin set on a routed interface")
	}
}

func TestCheckFindsWhatChanged(t *testing.T) {
	conf := netConf("1.1.0", prevResult("1.1.0"), "")
	h := newFakeHost()
	if _, _, err := run(t, h, "ADD", conf); err != nil {
		t.Fatal(err)
	}
	h.links["veth1234"].hairpin = false
	_, _, err := run(t, h, "CHECK", conf)
	cniError(t, err, types.ErrInternal, "hairpin mode is off on bridge port veth1234")

	h.links["veth1234"].hairpin = true
	h.forwarding = false
	_, _, err = run(t, h, "CHECK", conf)
	cniError(t, err, types.ErrInternal, "ip_forward is off")

	_, _, err = run(t, h, "CHECK", netConf("1.1.0", "", ""))
	cniError(t, err, types.ErrInvalidNetworkConfig, "prevResult")
}

// flows: a client's UDP flow through the VIP to the pod, a direct flow to
// the pod, and an unrelated flow to another pod.
func podFlows() (toPodViaVIP, toPodDirect, unrelated conntrack.Flow) {
	ap := netip.MustParseAddrPort
	toPodViaVIP = conntrack.Flow{Protocol: dataplane.UDP, OrigSrc: ap("198.19.64.3:20000"), OrigDst: ap("198.18.0.20:53"), ReplySrc: ap("198.19.64.2:5353"), ReplyDst: ap("198.19.64.3:20000")}
	toPodDirect = conntrack.Flow{Protocol: dataplane.UDP, OrigSrc: ap("198.19.64.3:20001"), OrigDst: ap("198.19.64.2:5353"), ReplySrc: ap("198.19.64.2:5353"), ReplyDst: ap("198.19.64.3:20001")}
	unrelated = conntrack.Flow{Protocol: dataplane.UDP, OrigSrc: ap("198.19.64.3:20002"), OrigDst: ap("198.18.0.20:53"), ReplySrc: ap("198.19.64.4:5353"), ReplyDst: ap("198.19.64.3:20002")}
	return
}

func TestDelDeletesFlowsOfThePod(t *testing.T) {
	for _, v := range SupportedVersions {
		t.Run(v, func(t *testing.T) {
			h := newFakeHost()
			viaVIP, direct, unrelated := podFlows()
			h.ct.Add(viaVIP, direct, unrelated)
			stdout, _, err := run(t, h, "DEL", netConf(v, prevResult(v), ""))
			if err != nil {
				t.Fatal(err)
			}
			if stdout != "" {
				t.Errorf("DEL printed %q, want nothing", stdout)
			}
			left, _ := h.ct.List()
			if len(left) != 1 || left[0] != unrelated {
				t.Errorf("left %v, want only the unrelated flow", left)
			}
			// DEL again: nothing to do, success.
			if _, _, err := run(t, h, "DEL", netConf(v, prevResult(v), "")); err != nil {
				t.Errorf("second DEL: %v", err)
			}
		})
	}
}

func TestDelWithoutPrevResult(t *testing.T) {
	h := newFakeHost()
	viaVIP, direct, unrelated := podFlows()
	h.ct.Add(viaVIP, direct, unrelated)
	// No prevResult: the addresses come from the pod's interface.
	if _, _, err := run(t, h, "DEL", netConf("1.0.0", "", "")); err != nil {
		t.Fatal(err)
	}
	if left, _ := h.ct.List(); len(left) != 1 {
		t.Errorf("left %v, want only the unrelated flow", left)
	}
	// A partial or unreadable prevResult behaves the same.
	h.ct.Add(viaVIP)
	if _, _, err := run(t, h, "DEL", netConf("1.0.0", `{"ips": [{"address": "garbage"}]}`, "")); err != nil {
		t.Fatalf("DEL with a bad prevResult: %v", err)
	}
	if left, _ := h.ct.List(); len(left) != 1 {
		t.Errorf("left %v, want only the unrelated flow", left)
	}
	h.ct.Add(viaVIP)
	if _, _, err := run(t, h, "DEL", netConf("1.0.0", `{"cniVersion": "1.0.0", "interfaces": []}`, "")); err != nil {
		t.Fatalf("DEL with a prevResult without IPs: %v", err)
	}
	if left, _ := h.ct.List(); len(left) != 1 {
		t.Errorf("left %v, want only the unrelated flow", left)
	}
	// Namespace gone, no prevResult: nothing to do, success.
	delete(h.pods, podNetns)
	if _, _, err := run(t, h, "DEL", netConf("1.0.0", "", "")); err != nil {
		t.Errorf("DEL with the namespace gone: %v", err)
	}
}

func TestDelConntrackCleanupOff(t *testing.T) {
	h := newFakeHost()
	viaVIP, direct, unrelated := podFlows()
	h.ct.Add(viaVIP, direct, unrelated)
	if _, _, err := run(t, h, "DEL", netConf("1.0.0", prevResult("1.0.0"), `, "conntrackCleanup": false`)); err != nil {
		t.Fatal(err)
	}
	if left, _ := h.ct.List(); len(left) != 3 {
		t.Errorf(`"conntrackCleanup": false deleted flows: left %v`, left)
	}
}
