//go:build ipvsvm

package ipvs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// The suite runs in a VM whose kernel it owns, but still puts the node, the
// client and every pod in namespaces of its own (test/sandbox's IP plan).
//
// Environment: STEELYARD_BIN (the static steelyard), STEELYARD_EXAMPLES (a
// copy of examples/), both set by scripts/vm/test-ipvs.sh.

var (
	steelyardBin = os.Getenv("STEELYARD_BIN")
	examplesDir  = os.Getenv("STEELYARD_EXAMPLES")
)

// Extra test Service with its own VIP and pods, for drain and weight changes.
const (
	drainVIP = "198.18.0.20"
	drainNS  = "ipvs"
)

type fixture struct {
	t      *testing.T
	sb     *sandbox.Sandbox
	client *sandbox.NS
	dir    string
	agent  *sandbox.Agent
}

func (f *fixture) steelyard(args ...string) (string, error) {
	stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin}, args...)...)
	return stdout + stderr, err
}

func (f *fixture) start() {
	f.t.Helper()
	a, err := f.sb.StartAgent(steelyardBin, "run", "--manifests", f.dir, "--mode", "ipvs",
		"--cluster-cidr", sandbox.ClusterCIDR.String(), "--cluster-cidr", sandbox.ClusterCIDR6.String(), "--log-level", "debug",
		"--sync-period", "5s", "--ipvs-graceful-period", "60s",
		"--metrics-bind-address", "", "--healthz-bind-address", "")
	if err != nil {
		f.t.Fatal(err)
	}
	f.agent = a
	start := time.Now()
	f.waitVerify(30 * time.Second)
	for !strings.Contains(a.Log(), "msg=synced") {
		if exited, err := a.Exited(); exited {
			f.t.Fatalf("agent exited: %v\n%s", err, a.Log())
		}
		if time.Since(start) > 30*time.Second {
			f.t.Fatalf("no first sync after 30 s:\n%s", a.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Logf("agent ready %s after start", time.Since(start).Round(time.Millisecond))
}

func (f *fixture) waitVerify(timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		out, err := f.steelyard("verify", "--manifests", f.dir, "--mode", "ipvs")
		if err == nil {
			return
		}
		if f.agent != nil {
			if exited, aerr := f.agent.Exited(); exited {
				f.t.Fatalf("agent exited: %v\n%s", aerr, f.agent.Log())
			}
		}
		if time.Now().After(deadline) {
			log := ""
			if f.agent != nil {
				log = f.agent.Log()
			}
			f.t.Fatalf("verify --mode ipvs still fails after %s: %v\n%s\nagent log:\n%s", timeout, err, out, log)
		}
		// Not faster: each verify competes with the agent's first sync
		// for the VM's CPUs.
		time.Sleep(500 * time.Millisecond)
	}
}

// dest is one line of ipvsadm -Ln under a virtual service.
type dest struct {
	Addr           string
	Weight, Active int
	Inactive       int
}

// ipvsadm runs `ipvsadm -Ln` in the node namespace and parses it:
// "TCP 198.18.0.10:80" (UDP, SCTP) -> destinations by address.
func (f *fixture) ipvsadm() (map[string]map[string]dest, string) {
	f.t.Helper()
	out, err := f.sb.Node.Exec("ipvsadm", "-Ln")
	if err != nil {
		f.t.Fatalf("ipvsadm -Ln: %v", err)
	}
	table := map[string]map[string]dest{}
	var cur string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		switch {
		case len(fl) >= 3 && (fl[0] == "TCP" || fl[0] == "UDP" || fl[0] == "SCTP"):
			cur = fl[0] + " " + fl[1]
			table[cur] = map[string]dest{}
		case len(fl) == 6 && fl[0] == "->" && cur != "":
			w, _ := strconv.Atoi(fl[3])
			a, _ := strconv.Atoi(fl[4])
			in, _ := strconv.Atoi(fl[5])
			table[cur][fl[1]] = dest{Addr: fl[1], Weight: w, Active: a, Inactive: in}
		}
	}
	return table, out
}

// waitTable polls ipvsadm until ok accepts the table.
func (f *fixture) waitTable(what string, timeout time.Duration, ok func(map[string]map[string]dest) bool) map[string]map[string]dest {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		table, out := f.ipvsadm()
		if ok(table) {
			return table
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: not reached after %s; ipvsadm -Ln:\n%s\nagent log tail:\n%s", what, timeout, out, tail(f.agent.Log(), 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func copyDir(t *testing.T, src, dst string) {
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// drainManifest is a Service with the given weights by pod name over pods
// drain-1 (198.19.5.2) and drain-2 (198.19.5.3); pods not in present are
// left out of the EndpointSlice.
func drainManifest(weights string, present ...string) string {
	return serviceManifest("drain", drainVIP, weights, map[string]string{"drain-1": "198.19.5.2", "drain-2": "198.19.5.3"}, present...)
}

// serviceManifest is a ClusterIP Service name (http 80 -> 8080) in drainNS
// with one EndpointSlice holding the pods of present (addresses from ips),
// weighted by the steelyard.io/weights annotation unless weights is "".
func serviceManifest(name, vip, weights string, ips map[string]string, present ...string) string {
	var b strings.Builder
	annotations := ""
	if weights != "" {
		annotations = fmt.Sprintf("\n  annotations:\n    steelyard.io/weights: %q", weights)
	}
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata:
  namespace: %s
  name: %s%s
spec:
  type: ClusterIP
  clusterIP: %s
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: %s
  name: %s-x1
  labels: {kubernetes.io/service-name: %s}
addressType: IPv4
ports:
  - {name: http, protocol: TCP, port: 8080}
endpoints:
`, drainNS, name, annotations, vip, drainNS, name, name)
	for _, p := range present {
		fmt.Fprintf(&b, "  - addresses: [%q]\n    conditions: {ready: true}\n    targetRef: {kind: Pod, namespace: %s, name: %s}\n", ips[p], drainNS, p)
	}
	return b.String()
}

// extraManifest: a Service over the quad pods with the mh scheduler and
// ClientIP affinity, and a UDP Service weighted 1:2:3:4 over them.
const extraManifest = `apiVersion: v1
kind: Service
metadata:
  namespace: ipvs
  name: sticky
  annotations:
    steelyard.io/ipvs-scheduler: mh
spec:
  type: ClusterIP
  clusterIP: 198.18.0.21
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata:
  namespace: ipvs
  name: dns
  annotations:
    steelyard.io/weights: "quad-1=1,quad-2=2,quad-3=3,quad-4=4"
spec:
  type: ClusterIP
  clusterIP: 198.18.0.22
  ports:
    - {name: dns, protocol: UDP, port: 53, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: ipvs
  name: sticky-x1
  labels: {kubernetes.io/service-name: sticky}
addressType: IPv4
ports:
  - {name: http, protocol: TCP, port: 8080}
endpoints:
  - {addresses: ["198.19.2.2"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-1}}
  - {addresses: ["198.19.2.3"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-2}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: ipvs
  name: dns-x1
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports:
  - {name: dns, protocol: UDP, port: 8080}
endpoints:
  - {addresses: ["198.19.2.2"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-1}}
  - {addresses: ["198.19.2.3"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-2}}
  - {addresses: ["198.19.2.4"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-3}}
  - {addresses: ["198.19.2.5"], conditions: {ready: true}, targetRef: {kind: Pod, namespace: ipvs, name: quad-4}}
`

func (f *fixture) write(name, text string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(text), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// expectExact checks a run's counts against want (pod -> count), within
// tol connections, and that nothing failed.
func expectExact(t *testing.T, r sandbox.Result, want map[string]int, tol int) {
	t.Helper()
	if r.Failed() > 0 || r.Attempted != r.Requested {
		t.Errorf("%d of %d connections failed, %d not attempted: %v", r.Failed(), r.Requested, r.Requested-r.Attempted, r.Errors)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		got := r.Counts[n]
		t.Logf("  %-8s want %4d  got %4d  (%.2f%%)", n, want[n], got, r.Share(n))
		if d := got - want[n]; d > tol || d < -tol {
			t.Errorf("%s: %d connections, want %d (±%d)", n, got, want[n], tol)
		}
	}
	for n, c := range r.Counts {
		if _, ok := want[n]; !ok {
			t.Errorf("%s answered %d connections but is not a configured backend", n, c)
		}
	}
}

func TestIPVS(t *testing.T) {
	if steelyardBin == "" || examplesDir == "" {
		t.Skip("runs inside the IPVS VM (scripts/vm/test-ipvs.sh); STEELYARD_BIN and STEELYARD_EXAMPLES unset")
	}
	suiteStart := time.Now()
	sb := sandbox.NewT(t, sandbox.Options{})
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sb: sb, client: client, dir: t.TempDir()}
	copyDir(t, examplesDir, f.dir)
	f.write("drain.yaml", drainManifest("drain-1=1,drain-2=1", "drain-1", "drain-2"))
	f.write("extra.yaml", extraManifest)
	// Local endpoints are those whose nodeName is this node's; the agent
	// and verify both read $NODE_NAME.
	t.Setenv("NODE_NAME", thisNode)

	// One pod per backend of the examples, as the iptables demo does.
	svcs, slices, errs := controller.NewManifestSource(f.dir).Load()
	if len(errs) > 0 {
		t.Fatalf("examples: %v", errs)
	}
	st, problems := controller.NewBuilder().Build(svcs, slices)
	if len(problems) > 0 {
		t.Fatalf("examples: %v", problems)
	}
	for _, sp := range st.Services {
		for _, b := range sp.Backends {
			if sb.Pod(b.Name) == nil {
				if _, err := sb.AddPod(b.Name, b.IP, b.Port); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	// The parity Services' pods tell the client address they see.
	f.write("parity.yaml", parityManifest)
	for _, p := range parityPods {
		pod, err := sb.AddPod(p.name, netip.MustParseAddr(p.ip))
		if err != nil {
			t.Fatal(err)
		}
		if err := pod.ServeSource(8080); err != nil {
			t.Fatal(err)
		}
	}
	outsider, err := sb.AddClient(netip.MustParseAddr("198.19.254.200"))
	if err != nil {
		t.Fatal(err)
	}
	f.setupIPv6()
	f.start()

	t.Run("explain", func(t *testing.T) {
		out, err := f.steelyard("explain", "--mode", "ipvs")
		if err != nil {
			t.Fatalf("explain: %v\n%s", err, out)
		}
		t.Logf("steelyard explain --mode ipvs:\n%s", out)
		_, adm := f.ipvsadm()
		t.Logf("ipvsadm -Ln:\n%s", adm)
		if want := "198.18.0.10:80/TCP  198.19.1.2:8080 10.00%  198.19.1.3:8080 90.00%  demo/web:http"; !strings.Contains(out, want) {
			t.Errorf("explain lacks %q", want)
		}
		jout, err := f.steelyard("explain", "--mode", "ipvs", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var views []dataplane.ServiceView
		if err := json.Unmarshal([]byte(jout), &views); err != nil {
			t.Fatal(err)
		}
		want := dataplane.Expected(st)
		if got := viewcheck.Shares(viewcheck.Find(views, "198.18.0.12", 80)); !viewcheck.Same(got, viewcheck.Shares(viewcheck.Find(want, "198.18.0.12", 80))) {
			t.Errorf("shop split: explain %v, want %v", got, viewcheck.Shares(viewcheck.Find(want, "198.18.0.12", 80)))
		}
	})

	t.Run("shares", func(t *testing.T) {
		// A client port reused while IPVS still holds its previous
		// connection costs a SYN retransmit (1 s, conn_reuse_mode 1 with
		// conntrack); under TCG allow for it.
		load := sandbox.Load{Concurrency: 16, Timeout: 5 * time.Second}
		start := time.Now()
		r, err := f.client.TCPConns(netip.MustParseAddrPort("198.18.0.10:80"), 1000, load)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("web 10/90: %s", r)
		expectExact(t, r, map[string]int{"web-1": 100, "web-2": 900}, 10)
		r, err = f.client.TCPConns(netip.MustParseAddrPort("198.18.0.11:80"), 1000, load)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("quad 1:2:3:4: %s", r)
		expectExact(t, r, map[string]int{"quad-1": 100, "quad-2": 200, "quad-3": 300, "quad-4": 400}, 10)
		t.Logf("2,000 connections in %s", time.Since(start).Round(time.Millisecond))
	})

	t.Run("ipvsadm-weights", func(t *testing.T) {
		table, out := f.ipvsadm()
		ratio := func(vs string, want map[string]float64) {
			ds := table[vs]
			total := 0
			for _, d := range ds {
				total += d.Weight
			}
			if len(ds) != len(want) || total == 0 {
				t.Errorf("%s: destinations %v, want %v\n%s", vs, ds, want, out)
				return
			}
			for addr, share := range want {
				got := 100 * float64(ds[addr].Weight) / float64(total)
				if math.Abs(got-share) > 0.01 {
					t.Errorf("%s -> %s: weight %d of %d = %.2f%%, want %.2f%%", vs, addr, ds[addr].Weight, total, got, share)
				}
			}
		}
		ratio("TCP 198.18.0.10:80", map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90})
		ratio("TCP 198.18.0.11:80", map[string]float64{"198.19.2.2:8080": 10, "198.19.2.3:8080": 20, "198.19.2.4:8080": 30, "198.19.2.5:8080": 40})
	})

	t.Run("scheduler-affinity-udp", func(t *testing.T) {
		_, out := f.ipvsadm()
		if !strings.Contains(out, "TCP  198.18.0.21:80 mh persistent 600") {
			t.Errorf("sticky: want scheduler mh with persistence 600 (annotation, ClientIP affinity):\n%s", out)
		}
		// Affinity: every connection of this client lands on one pod.
		r, err := f.client.TCPConns(netip.MustParseAddrPort("198.18.0.21:80"), 50, sandbox.Load{Concurrency: 4, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("sticky: %s", r)
		if r.Failed() > 0 || len(r.Counts) != 1 {
			t.Errorf("ClientIP affinity: %d failed, backends %v, want one backend", r.Failed(), r.Counts)
		}
		// UDP: each flow (own source port) is scheduled; wrr is exact.
		r, err = f.client.UDPFlows(netip.MustParseAddrPort("198.18.0.22:53"), 1000, sandbox.Load{Concurrency: 16, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("dns 1:2:3:4 over UDP: %s", r)
		expectExact(t, r, map[string]int{"quad-1": 100, "quad-2": 200, "quad-3": 300, "quad-4": 400}, 10)
	})

	t.Run("hairpin", func(t *testing.T) {
		// web-1 reaching its own VIP: a tenth of the connections come back
		// to web-1 itself, which works only if they are masqueraded.
		r, err := sb.Pod("web-1").NS.TCPConns(netip.MustParseAddrPort("198.18.0.10:80"), 100, sandbox.Load{Concurrency: 4, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("web-1 -> its own VIP: %s", r)
		expectExact(t, r, map[string]int{"web-1": 10, "web-2": 90}, 1)
	})

	t.Run("parity", func(t *testing.T) { f.parity(t, outsider) })
	t.Run("ipv6", f.ipv6)

	vsDrain := "TCP " + drainVIP + ":80"
	t.Run("weight-change-keeps-connection", func(t *testing.T) {
		c, err := f.client.Connect(netip.AddrPortFrom(netip.MustParseAddr(drainVIP), 80), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		addr := map[string]string{"drain-1": "198.19.5.2:8080", "drain-2": "198.19.5.3:8080"}[c.Backend]
		f.write("drain.yaml", drainManifest("drain-1=3,drain-2=7", "drain-1", "drain-2"))
		table := f.waitTable("weights 3/7", 20*time.Second, func(tb map[string]map[string]dest) bool {
			return tb[vsDrain]["198.19.5.2:8080"].Weight == 3 && tb[vsDrain]["198.19.5.3:8080"].Weight == 7
		})
		if err := c.Echo("after the weight change", 3*time.Second); err != nil {
			t.Errorf("established connection broken by a weight change: %v", err)
		}
		if d := table[vsDrain][addr]; d.Active != 1 {
			t.Errorf("%s: ActiveConn %d after the weight change, want 1 (destination untouched)", addr, d.Active)
		}
	})

	t.Run("removed-endpoint-drains", func(t *testing.T) {
		c, err := f.client.Connect(netip.AddrPortFrom(netip.MustParseAddr(drainVIP), 80), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		gone := c.Backend
		stay := map[string]string{"drain-1": "drain-2", "drain-2": "drain-1"}[gone]
		goneAddr := map[string]string{"drain-1": "198.19.5.2:8080", "drain-2": "198.19.5.3:8080"}[gone]
		f.write("drain.yaml", drainManifest("drain-1=3,drain-2=7", stay))
		f.waitTable(gone+" at weight 0", 20*time.Second, func(tb map[string]map[string]dest) bool {
			d, ok := tb[vsDrain][goneAddr]
			return ok && d.Weight == 0 && d.Active >= 1
		})
		if err := c.Echo("while draining", 3*time.Second); err != nil {
			t.Errorf("draining connection broken: %v", err)
		}
		r, err := f.client.TCPConns(netip.AddrPortFrom(netip.MustParseAddr(drainVIP), 80), 100, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		expectExact(t, r, map[string]int{stay: 100}, 0)
		if err := c.Echo("still draining", 3*time.Second); err != nil {
			t.Errorf("draining connection broken: %v", err)
		}
		c.Close()
		start := time.Now()
		f.waitTable(gone+" deleted once idle", 20*time.Second, func(tb map[string]map[string]dest) bool {
			_, ok := tb[vsDrain][goneAddr]
			return !ok
		})
		t.Logf("%s deleted %s after its last connection closed (graceful period 60 s)", goneAddr, time.Since(start).Round(time.Millisecond))
	})

	t.Run("restart-keeps-table", func(t *testing.T) {
		// Hold a connection on a draining destination across the restart.
		f.write("drain.yaml", drainManifest("drain-1=3,drain-2=7", "drain-1", "drain-2"))
		f.waitTable("both drain pods back", 20*time.Second, func(tb map[string]map[string]dest) bool { return len(tb[vsDrain]) == 2 })
		c, err := f.client.Connect(netip.AddrPortFrom(netip.MustParseAddr(drainVIP), 80), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stay := map[string]string{"drain-1": "drain-2", "drain-2": "drain-1"}[c.Backend]
		goneAddr := map[string]string{"drain-1": "198.19.5.2:8080", "drain-2": "198.19.5.3:8080"}[c.Backend]
		f.write("drain.yaml", drainManifest("drain-1=3,drain-2=7", stay))
		f.waitTable("draining before restart", 20*time.Second, func(tb map[string]map[string]dest) bool {
			d, ok := tb[vsDrain][goneAddr]
			return ok && d.Weight == 0
		})
		before, beforeOut := f.ipvsadm()
		if err := f.agent.Stop(); err != nil {
			t.Errorf("agent exit on SIGTERM: %v", err)
		}
		f.start()
		after, afterOut := f.ipvsadm()
		if !sameWeights(before, after) {
			t.Errorf("restart changed the table:\nbefore:\n%s\nafter:\n%s", beforeOut, afterOut)
		}
		if d := after[vsDrain][goneAddr]; d.Weight != 0 {
			t.Errorf("restart raised a draining destination to weight %d (kubernetes#92019)", d.Weight)
		}
		if err := c.Echo("after the restart", 3*time.Second); err != nil {
			t.Errorf("connection broken by the restart: %v", err)
		}
	})

	t.Run("cleanup", func(t *testing.T) {
		if err := f.agent.Stop(); err != nil {
			t.Errorf("agent exit: %v", err)
		}
		if out, err := f.steelyard("cleanup", "--mode", "ipvs"); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		table, out := f.ipvsadm()
		if len(table) != 0 {
			t.Errorf("virtual services left after cleanup:\n%s", out)
		}
		if links, _ := f.sb.Node.Exec("ip", "-o", "link", "show"); strings.Contains(links, "steelyard0") {
			t.Errorf("steelyard0 left after cleanup:\n%s", links)
		}
		if sets, _ := f.sb.Node.Exec("ipset", "list", "-n"); strings.Contains(sets, "STEELYARD") {
			t.Errorf("ipsets left after cleanup: %s", sets)
		}
		for _, save := range []string{"iptables-save", "ip6tables-save"} {
			if rules, _ := f.sb.Node.Exec(save); strings.Contains(rules, "STEELYARD") {
				t.Errorf("%s: rules left after cleanup:\n%s", save, rules)
			}
		}
	})
	logSyncTimes(t, sb)
	t.Logf("IPVS suite took %s inside the VM", time.Since(suiteStart).Round(time.Millisecond))
}

// logSyncTimes summarises the agents' "synced" lines: how long full and
// partial syncs took in the VM (TCG, so several times slower than a host).
func logSyncTimes(t *testing.T, sb *sandbox.Sandbox) {
	times := map[string][]time.Duration{}
	for _, a := range sb.Agents() {
		for _, l := range strings.Split(a.Log(), "\n") {
			if !strings.Contains(l, "msg=synced") {
				continue
			}
			kind := "partial"
			if strings.Contains(l, "full=true") {
				kind = "full"
			}
			_, took, ok := strings.Cut(l, "took=")
			if !ok {
				continue
			}
			if d, err := time.ParseDuration(strings.Fields(took)[0]); err == nil {
				times[kind] = append(times[kind], d)
			}
		}
	}
	for _, kind := range []string{"full", "partial"} {
		ds := times[kind]
		if len(ds) == 0 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s syncs in the VM: %d, median %s, max %s", kind, len(ds), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}
}

func sameWeights(a, b map[string]map[string]dest) bool {
	if len(a) != len(b) {
		return false
	}
	for vs, ds := range a {
		if len(ds) != len(b[vs]) {
			return false
		}
		for addr, d := range ds {
			if e, ok := b[vs][addr]; !ok || e.Weight != d.Weight {
				return false
			}
		}
	}
	return true
}
