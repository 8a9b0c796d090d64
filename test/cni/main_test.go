//go:build cni

package cni

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

var (
	// steelyardBin is the agent under test.
	steelyardBin string
	// pluginDir holds the reference plugins bridge and host-local.
	pluginDir string
	// steelyardCNIBin is the plugin under test, which each chain test
	// installs with `steelyard install-cni`.
	steelyardCNIBin string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	bin, cleanup, err := sandbox.AgentBinary("cni")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni:", err)
		return 1
	}
	defer cleanup()
	steelyardBin = bin
	dir, err := os.MkdirTemp("", "steelyard-cni-plugins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cni:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := preparePlugins(dir); err != nil {
		fmt.Fprintln(os.Stderr, "cni:", err)
		return 1
	}
	pluginDir = dir
	stop := sandbox.CloseOnSignal()
	defer stop()
	return m.Run()
}

// preparePlugins fills dir with the reference plugins and finds or builds
// steelyard-cni ($STEELYARD_CNI_BIN, else a fresh build in dir/build).
func preparePlugins(dir string) error {
	ref := os.Getenv("CNI_PLUGINS_DIR")
	if ref == "" {
		start := time.Now()
		cmd := exec.Command("../../scripts/cni-plugins.sh")
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("scripts/cni-plugins.sh: %w", err)
		}
		ref = strings.TrimSpace(string(out))
		fmt.Fprintf(os.Stderr, "cni: reference plugins in %s (%s)\n", ref, time.Since(start).Round(time.Millisecond))
	}
	for _, p := range []string{"bridge", "host-local"} {
		b, err := os.ReadFile(filepath.Join(ref, p))
		if err != nil {
			return fmt.Errorf("reference plugin %s: %w", p, err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o755); err != nil {
			return err
		}
	}
	if p := os.Getenv("STEELYARD_CNI_BIN"); p != "" {
		steelyardCNIBin = p
		return nil
	}
	steelyardCNIBin = filepath.Join(dir, "build", "steelyard-cni")
	build := exec.Command("go", "build", "-o", steelyardCNIBin, "github.com/steelyard-net/steelyard/cmd/steelyard-cni")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("building cmd/steelyard-cni: %w", err)
	}
	return nil
}

// endpoint is one endpoint of a test Service.
type endpoint struct {
	name, ip string
	weight   int // 0: the default (1)
}

// service is a test Service with one port and one EndpointSlice.
type service struct {
	name, vip  string
	proto      string // "TCP" or "UDP"
	port       int
	targetPort int
	// nodePort, when set, makes it a NodePort Service (external traffic
	// policy Cluster) on that port.
	nodePort int
	// externalIPs are the Service's spec.externalIPs.
	externalIPs []string
	endpoints   []endpoint
}

// yaml renders the Service and its EndpointSlice; endpoint weights go into
// the steelyard.io/weights annotation.
func (s service) yaml() string {
	var weights []string
	for _, e := range s.endpoints {
		if e.weight >= 0 {
			w := e.weight
			if w == 0 {
				w = 1
			}
			weights = append(weights, fmt.Sprintf("%s=%d", e.name, w))
		} else {
			weights = append(weights, e.name+"=0")
		}
	}
	typ, np := "", ""
	if s.nodePort != 0 {
		typ, np = "\n  type: NodePort", fmt.Sprintf(", nodePort: %d", s.nodePort)
	}
	if len(s.externalIPs) > 0 {
		typ += "\n  externalIPs: [" + strings.Join(s.externalIPs, ", ") + "]"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata:
  name: %s
  namespace: cni
  annotations:
    steelyard.io/weights: %q
spec:
  clusterIP: %s%s
  ports:
  - {name: p, port: %d, protocol: %s, targetPort: %d%s}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %s-a
  namespace: cni
  labels: {kubernetes.io/service-name: %s}
addressType: IPv4
ports:
- {name: p, port: %d, protocol: %s}
endpoints:`, s.name, strings.Join(weights, ","), s.vip, typ, s.port, s.proto, s.targetPort, np, s.name, s.name, s.targetPort, s.proto)
	if len(s.endpoints) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, e := range s.endpoints {
		fmt.Fprintf(&b, "- addresses: [%s]\n  conditions: {ready: true}\n  targetRef: {kind: Pod, namespace: cni, name: %s}\n", e.ip, e.name)
	}
	return b.String()
}

// drained is the weight that writes "name=0".
const drained = -1

// manifests is the agent's manifest folder.
type manifests struct {
	t   *testing.T
	dir string
}

// write replaces the manifests with services, atomically (the agent's
// watch never sees half a file).
func (m manifests) write(services ...service) {
	m.t.Helper()
	var b strings.Builder
	for _, s := range services {
		b.WriteString(s.yaml())
	}
	tmp := filepath.Join(m.dir, ".services.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(m.dir, "services.yaml")); err != nil {
		m.t.Fatal(err)
	}
}

// startAgent runs the agent in the node namespace on dir and waits for its
// first sync and for verify to pass.
func startAgent(t *testing.T, sb *sandbox.Sandbox, dir string) *sandbox.Agent {
	t.Helper()
	a, err := sb.StartAgent(steelyardBin, "run", "--manifests", dir, "--log-level", "debug",
		"--cluster-cidr", sandbox.ClusterCIDR.String())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(a.Log(), "msg=synced") {
		if exited, err := a.Exited(); exited {
			t.Fatalf("agent exited: %v\n%s", err, a.Log())
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent never synced:\n%s", a.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitVerify(t, sb, dir, 10*time.Second)
	return a
}

// waitVerify polls `steelyard verify` until the kernel matches dir.
func waitVerify(t *testing.T, sb *sandbox.Sandbox, dir string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, stderr, err := sb.Node.Exec2(steelyardBin, "verify", "--manifests", dir)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("verify still fails after %s: %v\n%s%s", timeout, err, out, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// conntrackList runs `conntrack -L -p udp` in n and parses its lines.
func conntrackList(t *testing.T, n *sandbox.NS) []conntrack.Flow {
	t.Helper()
	out, stderr, err := n.Exec2("conntrack", "-L", "-p", "udp")
	if err != nil {
		t.Fatalf("conntrack -L: %v\n%s", err, stderr)
	}
	var flows []conntrack.Flow
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if f, ok := parseConntrackLine(sc.Text()); ok {
			flows = append(flows, f)
		}
	}
	return flows
}

// parseConntrackLine reads "udp 17 29 src=A dst=B sport=1 dport=2 ...
// src=C dst=D sport=3 dport=4 ...": the first four keys are the original
// tuple, the next four the reply tuple.
func parseConntrackLine(line string) (conntrack.Flow, bool) {
	var addrs []netip.Addr
	var ports []uint16
	for _, field := range strings.Fields(line) {
		k, v, ok := strings.Cut(field, "=")
		if !ok {
			continue
		}
		switch k {
		case "src", "dst":
			a, err := netip.ParseAddr(v)
			if err != nil {
				return conntrack.Flow{}, false
			}
			addrs = append(addrs, a)
		case "sport", "dport":
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return conntrack.Flow{}, false
			}
			ports = append(ports, uint16(p))
		}
	}
	if len(addrs) < 4 || len(ports) < 4 {
		return conntrack.Flow{}, false
	}
	return conntrack.Flow{
		Protocol: dataplane.Protocol(strings.ToUpper(strings.Fields(line)[0])),
		OrigSrc:  netip.AddrPortFrom(addrs[0], ports[0]),
		OrigDst:  netip.AddrPortFrom(addrs[1], ports[1]),
		ReplySrc: netip.AddrPortFrom(addrs[2], ports[2]),
		ReplyDst: netip.AddrPortFrom(addrs[3], ports[3]),
	}, true
}

// flowsTo returns the flows whose original destination is dst (any port
// when dst's port is 0) and whose reply source has address backend (any
// when invalid).
func flowsTo(flows []conntrack.Flow, dst netip.AddrPort, backend netip.Addr) []conntrack.Flow {
	var out []conntrack.Flow
	for _, f := range flows {
		if f.OrigDst.Addr() != dst.Addr() || dst.Port() != 0 && f.OrigDst.Port() != dst.Port() {
			continue
		}
		if backend.IsValid() && f.ReplySrc.Addr() != backend {
			continue
		}
		out = append(out, f)
	}
	return out
}

// pointingAt returns the flows whose original destination or reply source
// is a.
func pointingAt(flows []conntrack.Flow, a netip.Addr) []conntrack.Flow {
	var out []conntrack.Flow
	for _, f := range flows {
		if f.OrigDst.Addr() == a || f.ReplySrc.Addr() == a {
			out = append(out, f)
		}
	}
	return out
}

// fromSource returns the flow of the stream whose source port is port.
func fromSource(flows []conntrack.Flow, src netip.AddrPort) []conntrack.Flow {
	var out []conntrack.Flow
	for _, f := range flows {
		if f.OrigSrc == src {
			out = append(out, f)
		}
	}
	return out
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
