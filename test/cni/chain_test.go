//go:build cni

package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	steelyardcni "github.com/steelyard-net/steelyard/cni"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

const (
	bridgeName = "syb0"
	podSubnet  = "198.19.64.0/24"
	podGateway = "198.19.64.1"
)

var (
	selfVIP = ap("198.18.0.20:80")
	echoVIP = ap("198.18.0.21:53")
)

// nsExec runs every plugin inside the node namespace with `ip netns exec`,
// so nothing a plugin does (bridge, veths, sysctls, conntrack) can reach
// the machine's own namespace.
type nsExec struct {
	ns     string
	stderr *bytes.Buffer
}

func (e *nsExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", e.ns, pluginPath)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	e.stderr.Write(stderr.Bytes())
	if err != nil {
		// A plugin reports its failure as a CNI error on stdout.
		var cniErr types.Error
		if json.Unmarshal(stdout.Bytes(), &cniErr) == nil && cniErr.Msg != "" {
			return nil, &cniErr
		}
		return nil, fmt.Errorf("%s: %w: %s%s", pluginPath, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

func (e *nsExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *nsExec) Decode(b []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(b)
}

// chain is the conflist under test and a libcni runner for it.
type chain struct {
	t      *testing.T
	sb     *sandbox.Sandbox
	list   *libcni.NetworkConfigList
	cni    *libcni.CNIConfig
	stderr *bytes.Buffer
}

func newChain(t *testing.T, sb *sandbox.Sandbox, specVersion string) *chain {
	t.Helper()
	// The node's CNI set-up before steelyard: the main plugin's conflist.
	// The bridge plugin's own hairpinMode stays off: hairpin is
	// steelyard-cni's job here.
	confDir, binDir := t.TempDir(), t.TempDir()
	conflist := fmt.Sprintf(`{
  "cniVersion": %q,
  "name": "steelyard-test",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": false,
     "ipam": {"type": "host-local", "dataDir": %q,
              "ranges": [[{"subnet": %q, "gateway": %q}]],
              "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}`, specVersion, bridgeName, t.TempDir(), podSubnet, podGateway)
	path := filepath.Join(confDir, "10-bridge.conflist")
	if err := os.WriteFile(path, []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	// What the DaemonSet's init container does, twice: the second run
	// changes nothing.
	var installed []byte
	for run := 1; run <= 2; run++ {
		out, err := exec.Command(steelyardBin, "install-cni", "--plugin", steelyardCNIBin, "--cni-bin-dir", binDir, "--cni-conf-dir", confDir).CombinedOutput()
		if err != nil {
			t.Fatalf("install-cni (run %d): %v\n%s", run, err, out)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if run == 2 && !bytes.Equal(got, installed) {
			t.Errorf("a second install-cni changed the conflist:\n%s\nto\n%s", installed, got)
		}
		installed = got
	}
	list, err := libcni.LoadConfList(confDir, "steelyard-test")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, p := range list.Plugins {
		kinds = append(kinds, p.Network.Type)
	}
	if strings.Join(kinds, ",") != "bridge,steelyard-cni" {
		t.Fatalf("installed conflist chains %v, want bridge then steelyard-cni:\n%s", kinds, installed)
	}
	stderr := &bytes.Buffer{}
	c := &chain{t: t, sb: sb, list: list, stderr: stderr,
		cni: libcni.NewCNIConfigWithCacheDir([]string{binDir, pluginDir}, t.TempDir(), &nsExec{ns: sb.Node.Name, stderr: stderr})}
	t.Cleanup(func() {
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("plugins' stderr:\n%s", stderr)
		}
	})
	return c
}

func (c *chain) rt(p *sandbox.Pod) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: "ctr-" + p.Name, NetNS: p.NS.Path(), IfName: "eth0"}
}

// add runs ADD for pod p and returns its IP and host-side veth.
func (c *chain) add(p *sandbox.Pod) (netip.Addr, string) {
	c.t.Helper()
	res, err := c.cni.AddNetworkList(context.Background(), c.list, c.rt(p))
	if err != nil {
		c.t.Fatalf("ADD %s: %v", p.Name, err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(r.IPs) != 1 {
		c.t.Fatalf("ADD %s: IPs %v", p.Name, r.IPs)
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP)
	ip = ip.Unmap()
	veth := ""
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && i.Name != bridgeName {
			veth = i.Name
		}
	}
	if veth == "" {
		c.t.Fatalf("ADD %s: no host veth in %+v", p.Name, r.Interfaces)
	}
	p.IP = ip
	c.t.Logf("ADD %s: %s on %s", p.Name, ip, veth)
	return ip, veth
}

func (c *chain) check(p *sandbox.Pod) error {
	return c.cni.CheckNetworkList(context.Background(), c.list, c.rt(p))
}

func (c *chain) del(p *sandbox.Pod) error {
	return c.cni.DelNetworkList(context.Background(), c.list, c.rt(p))
}

// hairpin reads the hairpin flag of a bridge port in the node namespace.
func hairpin(t *testing.T, sb *sandbox.Sandbox, veth string) bool {
	t.Helper()
	out, err := sb.Node.Exec("bridge", "-d", "link", "show", "dev", veth)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(out, "hairpin on")
}

func TestChain(t *testing.T) {
	for _, v := range steelyardcni.SupportedVersions {
		t.Run(v, func(t *testing.T) { testChain(t, v) })
	}
}

func testChain(t *testing.T, specVersion string) {
	sb := sandbox.NewT(t, sandbox.Options{})
	c := newChain(t, sb, specVersion)
	if _, err := c.cni.ValidateNetworkList(context.Background(), c.list); err != nil {
		t.Fatalf("libcni validation (every plugin supports %s): %v", specVersion, err)
	}

	// Pods a (the hairpin one, and the client), b and c (UDP endpoints).
	pods := map[string]*sandbox.Pod{}
	veths := map[string]string{}
	for _, name := range []string{"a", "b", "c"} {
		p, err := sb.AddBarePod(name, 8080, 5353)
		if err != nil {
			t.Fatal(err)
		}
		pods[name] = p
		_, veths[name] = c.add(p)
		if !hairpin(t, sb, veths[name]) {
			t.Errorf("after ADD, hairpin mode is off on %s's bridge port %s", name, veths[name])
		}
		if err := c.check(p); err != nil {
			t.Errorf("CHECK %s: %v", name, err)
		}
	}
	if fwd, err := sb.Node.ReadSysctl("net/ipv4/ip_forward"); err != nil || fwd != "1" {
		t.Errorf("node ip_forward %q (%v), want 1", fwd, err)
	}
	if specVersion == "1.1.0" {
		if err := c.cni.GetStatusNetworkList(context.Background(), c.list); err != nil {
			t.Errorf("STATUS: %v", err)
		}
	}

	// The agent in the node namespace (the one holding the bridge).
	a, b, cc := pods["a"], pods["b"], pods["c"]
	ep := func(p *sandbox.Pod, weight int) endpoint {
		return endpoint{name: p.Name, ip: p.IP.String(), weight: weight}
	}
	self := service{name: "self", vip: selfVIP.Addr().String(), proto: "TCP", port: 80, targetPort: 8080, endpoints: []endpoint{ep(a, 1)}}
	echo := func(wb, wc int) service {
		return service{name: "echo", vip: echoVIP.Addr().String(), proto: "UDP", port: 53, targetPort: 5353, endpoints: []endpoint{ep(b, wb), ep(cc, wc)}}
	}
	m := manifests{t: t, dir: t.TempDir()}
	m.write(self, echo(1, 1))
	startAgent(t, sb, m.dir)

	// Hairpin: a reaches itself through the VIP.
	r, err := a.NS.TCPConns(selfVIP, 20, sandbox.Load{Concurrency: 4, Timeout: 2 * time.Second})
	t.Logf("pod a -> %s: %s", selfVIP, r)
	if err != nil || r.Counts["a"] != 20 {
		t.Errorf("pod a through its own VIP: %s (%v), want 20/20 answered by a", r, err)
	}

	// The plugin path of the stale-flow test: a streams UDP to the echo
	// VIP and reaches x; x is drained to weight 0 (established flows keep
	// going, as during a pod's termination), then its pod is deleted.
	s, err := a.NS.StartUDPStream(echoVIP, streamEvery, streamMax)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	first, err := s.WaitReply(time.Time{}, 3*time.Second, func(sandbox.Reply) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	x, y := b, cc
	if first.From == cc.Name {
		x, y = cc, b
	}
	t.Logf("a's flow %s -> %s reached %s (%s)", s.LocalAddr(), echoVIP, x.Name, x.IP)
	// An unrelated flow: a to y directly.
	direct, err := a.NS.StartUDPStream(netip.AddrPortFrom(y.IP, 5353), streamEvery, streamMax)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Stop()
	if _, err := direct.WaitReply(time.Time{}, 3*time.Second, func(r sandbox.Reply) bool { return r.From == y.Name }); err != nil {
		t.Fatal(err)
	}
	if x == b {
		m.write(self, echo(drained, 1))
	} else {
		m.write(self, echo(1, drained))
	}
	waitVerify(t, sb, m.dir, 5*time.Second)
	time.Sleep(3 * streamEvery)
	if last := s.Last(); last.From != x.Name {
		t.Fatalf("after draining %s the flow went to %s; a drained endpoint keeps its flows", x.Name, last.From)
	}
	if got := pointingAt(conntrackList(t, sb.Node), x.IP); len(got) == 0 {
		t.Fatalf("no conntrack entry points at %s before its DEL", x.IP)
	}

	// The runtime deletes x: DEL, then the namespace goes.
	t0 := time.Now()
	if err := c.del(x); err != nil {
		t.Fatalf("DEL %s: %v", x.Name, err)
	}
	delTook := time.Since(t0)
	if err := sb.RemoveBarePod(x.Name); err != nil {
		t.Fatal(err)
	}
	took := waitMoved(t, s, t0, y.Name)
	t.Logf("MEASURED plugin path (spec %s): DEL of %s took %s; the flow's datagrams reached %s %s after DEL began", specVersion, x.Name, delTook.Round(time.Millisecond), y.Name, took.Round(time.Millisecond))
	flows := conntrackList(t, sb.Node)
	if got := pointingAt(flows, x.IP); len(got) != 0 {
		t.Errorf("conntrack -L still has entries pointing at the deleted %s: %v", x.IP, got)
	}
	if got := flowsTo(flows, netip.AddrPortFrom(y.IP, 5353), y.IP); len(got) != 1 {
		t.Errorf("the unrelated direct flow a -> %s lost its entry: %v", y.IP, got)
	}

	// DEL again (no cached result, no namespace): success.
	if err := c.del(x); err != nil {
		t.Errorf("second DEL of %s: %v", x.Name, err)
	}
	for _, p := range []*sandbox.Pod{a, y} {
		if err := c.check(p); err != nil {
			t.Errorf("CHECK %s after %s left: %v", p.Name, x.Name, err)
		}
	}

	// CHECK notices when hairpin mode was turned off behind our back.
	if _, err := sb.Node.Exec("ip", "link", "set", "dev", veths["a"], "type", "bridge_slave", "hairpin", "off"); err != nil {
		t.Fatal(err)
	}
	err = c.check(a)
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || !strings.Contains(cniErr.Msg, "hairpin mode is off") {
		t.Errorf("CHECK with hairpin off: %v, want a CNI error about hairpin", err)
	}
	// The control: without hairpin mode a cannot reach itself through the
	// VIP (the translated packet would leave by the port it came in by).
	r, _ = a.NS.TCPConns(selfVIP, 2, sandbox.Load{Concurrency: 2, Timeout: 500 * time.Millisecond})
	t.Logf("hairpin off: pod a -> %s: %s", selfVIP, r)
	if r.Counts["a"] != 0 {
		t.Errorf("with hairpin off pod a still reached itself through %s: %s; the hairpin check proves nothing", selfVIP, r)
	}
	for _, p := range []*sandbox.Pod{a, y} {
		if err := c.del(p); err != nil {
			t.Errorf("DEL %s: %v", p.Name, err)
		}
		if err := c.del(p); err != nil {
			t.Errorf("second DEL %s: %v", p.Name, err)
		}
	}
	if _, err := os.Stat(x.NS.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace of %s still there: %v", x.Name, err)
	}
}
