//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// steelyardBin is the agent binary under test.
var steelyardBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	bin, cleanup, err := sandbox.AgentBinary("e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer cleanup()
	steelyardBin = bin
	undo, err := setupEBPF()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer undo()
	stop := sandbox.CloseOnSignal()
	defer stop()
	return m.Run()
}

// pod is one endpoint of a test Service.
type pod struct {
	name string
	ip   string
}

// svc describes a test Service and (unless endpoints is nil) its one
// EndpointSlice. The Service port is named after the protocol ("tcp"/"udp").
type svc struct {
	name, vip   string
	proto       corev1.Protocol // TCP when empty
	port        int32
	targetPort  int32
	annotations map[string]string
	endpoints   []pod
	// extraPorts adds more Service ports (same targetPort and protocol
	// rules) to make a multi-port Service, as in the reject test.
	extraPorts []corev1.ServicePort
}

const testNamespace = "e2e"

// objects returns the Service and EndpointSlice of s.
func (s svc) objects() []any {
	proto := s.proto
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	portName := strings.ToLower(string(proto))
	service := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   testNamespace,
			Name:        s.name,
			Annotations: s.annotations,
		},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: s.vip,
			Ports: append([]corev1.ServicePort{{
				Name:       portName,
				Protocol:   proto,
				Port:       s.port,
				TargetPort: intstr.FromInt32(s.targetPort),
			}}, s.extraPorts...),
		},
	}
	objs := []any{service}
	if s.endpoints == nil {
		return objs
	}
	ready := true
	sl := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: testNamespace,
			Name:      s.name + "-abcde",
			Labels:    map[string]string{discoveryv1.LabelServiceName: s.name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &s.targetPort}},
	}
	for _, p := range s.endpoints {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: testNamespace, Name: p.name},
		})
	}
	return append(objs, sl)
}

// fixture is a sandbox with a client, a manifest directory and the agent.
type fixture struct {
	t      *testing.T
	sb     *sandbox.Sandbox
	client *sandbox.NS
	dir    string
	// m is the dataplane mode of every steelyard command.
	m     dpMode
	agent *sandbox.Agent
	// noClusterCIDR starts the agent without --cluster-cidr, so Service
	// chains hold only the endpoint rules.
	noClusterCIDR bool
}

func newFixture(t *testing.T, m dpMode) *fixture {
	t.Helper()
	if m.name == "ebpf" {
		// After the sandbox has stopped the agent (cleanups run last
		// first): no table outlives its case.
		t.Cleanup(clearPins)
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, sb: sb, client: client, dir: t.TempDir(), m: m}
}

// addPods starts a pod (servers on the Service's target port) for every
// endpoint of services.
func (f *fixture) addPods(services ...svc) {
	f.t.Helper()
	for _, s := range services {
		for _, p := range s.endpoints {
			if f.sb.Pod(p.name) != nil {
				continue
			}
			if _, err := f.sb.AddPod(p.name, netip.MustParseAddr(p.ip), uint16(s.targetPort)); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

// write (re)writes file in the manifest directory with the objects of
// services, as one multi-document YAML file.
func (f *fixture) write(file string, services ...svc) {
	f.t.Helper()
	var b strings.Builder
	b.WriteString("# written by " + f.t.Name() + "\n")
	for _, s := range services {
		for _, o := range s.objects() {
			y, err := yaml.Marshal(o)
			if err != nil {
				f.t.Fatal(err)
			}
			b.WriteString("---\n")
			b.Write(y)
		}
	}
	if err := os.WriteFile(filepath.Join(f.dir, file), []byte(b.String()), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) modeArgs() []string { return f.m.args }

// start runs the agent on the manifest directory (with --cluster-cidr
// unless f.noClusterCIDR) plus extra flags, and waits until verify passes.
func (f *fixture) start(extra ...string) {
	f.t.Helper()
	args := append([]string{"run", "--manifests", f.dir, "--log-level", "debug"}, f.modeArgs()...)
	if !f.noClusterCIDR {
		args = append(args, "--cluster-cidr", sandbox.ClusterCIDR.String())
	}
	args = append(args, extra...)
	a, err := f.sb.StartAgent(steelyardBin, args...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.agent = a
	start := time.Now()
	f.waitVerify(20 * time.Second)
	// After a restart verify passes at once (the rules stayed), so also wait
	// for the agent's own first sync: only then is its manifest watch
	// surely in place (see the report on the startup race in cmd/steelyard).
	for !agentSynced(a.Log()) {
		if exited, err := a.Exited(); exited {
			f.t.Fatalf("agent exited: %v", err)
		}
		if time.Since(start) > 20*time.Second {
			f.t.Fatal("the agent never logged its first sync")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Logf("agent ready in %s (first sync done, verify passes) %s after start", f.m.name, time.Since(start).Round(time.Millisecond))
}

// agentSynced tells whether an agent log (text or JSON format) shows a
// completed sync: the agent's own line, not a dataplane's "synced" at
// debug level, which the nftables half of the ebpf mode logs before the
// socket programs are attached (connections made then went through
// nftables, and TestEBPFSocketLB saw the VIP in conntrack).
func agentSynced(log string) bool {
	for _, line := range strings.Split(log, "\n") {
		if (strings.Contains(line, "msg=synced") || strings.Contains(line, `"msg":"synced"`)) &&
			(strings.Contains(line, "subsys=agent") || strings.Contains(line, `"subsys":"agent"`)) {
			return true
		}
	}
	return false
}

// steelyard runs a CLI command in the node namespace.
func (f *fixture) steelyard(args ...string) (string, error) {
	out, err := f.sb.Node.Exec(append([]string{steelyardBin}, args...)...)
	return out, err
}

// verify runs `steelyard verify` and returns its combined output and exit code.
func (f *fixture) verify() (string, int) {
	stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin, "verify", "--manifests", f.dir}, f.modeArgs()...)...)
	return stdout + stderr, sandbox.ExitCode(err)
}

// waitVerify polls verify until it passes; fails the test after timeout or
// when the agent exits.
func (f *fixture) waitVerify(timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if f.agent != nil {
			if exited, err := f.agent.Exited(); exited {
				f.t.Fatalf("agent exited: %v", err)
			}
		}
		out, code := f.verify()
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("verify still fails after %s (exit %d):\n%s", timeout, code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// explain returns `steelyard explain -o json` of the node namespace.
func (f *fixture) explain() []dataplane.ServiceView {
	f.t.Helper()
	out, err := f.steelyard(append([]string{"explain", "-o", "json"}, f.modeArgs()...)...)
	if err != nil {
		f.t.Fatalf("explain: %v", err)
	}
	var views []dataplane.ServiceView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		f.t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	return views
}

func addrPort(vip string, port int32) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(vip), uint16(port))
}

// iptablesCmd returns the iptables tool of mode ("" = the plain one).
func iptablesCmd(mode, tool string) string {
	if mode == "" || mode == "auto" {
		return tool
	}
	return strings.Replace(tool, "iptables", "iptables-"+mode, 1)
}
