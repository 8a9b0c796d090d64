//go:build node

package node

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// dialerEnv makes the test binary a dialer (TestMain): "NETNS DST WORKERS
// SECONDS". The socket programs of --mode ebpf see the sockets of the
// processes in their cgroup only, so the pod's connections must come from
// a process in the pod's cgroup, not from a thread of this test that
// entered the pod's network namespace: startDialer starts this binary
// there (CLONE_INTO_CGROUP) and it dials from the pod's namespace.
const dialerEnv = "STEELYARD_NODE_DIALER"

// dialLine is one connection of the dialer: when it started (ms since the
// dialer's start), who answered, the peer address the application sees
// (getpeername), its own address, or the error.
type dialLine struct {
	MS    int64  `json:"ms"`
	Host  string `json:"host,omitempty"`
	Peer  string `json:"peer,omitempty"`
	Local string `json:"local,omitempty"`
	Err   string `json:"err,omitempty"`
}

// dialerMain is the dialer: WORKERS connections at a time, each at most
// 100 a second, one GET /hostname each (Connection: close), a JSON line
// per connection on stdout, until stdin closes or SECONDS pass.
func dialerMain() int {
	f := strings.Fields(os.Getenv(dialerEnv))
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, "dialer: want NETNS DST WORKERS SECONDS")
		return 2
	}
	h, err := ns.GetNS(f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "dialer:", err)
		return 1
	}
	dst, err := netip.ParseAddrPort(f[1])
	workers, err2 := strconv.Atoi(f[2])
	secs, err3 := strconv.Atoi(f[3])
	if err != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, "dialer: bad arguments:", f)
		return 2
	}
	netns := inNS(func(fn func() error) error { return h.Do(func(ns.NetNS) error { return fn() }) })
	done := make(chan struct{})
	go func() {
		stdin := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdin) }()
		select {
		case <-stdin:
		case <-time.After(time.Duration(secs) * time.Second):
		}
		close(done)
	}()
	start := time.Now()
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-tick.C:
				}
				l := dialLine{MS: time.Since(start).Milliseconds()}
				c, err := dialIn(netns, dst, 3*time.Second)
				if err == nil {
					// Go's dial fills RemoteAddr from getpeername(2).
					l.Peer, l.Local = c.RemoteAddr().String(), c.LocalAddr().String()
					_ = c.SetDeadline(time.Now().Add(5 * time.Second))
					l.Host, err = getHostname(c, "close")
					c.Close()
				}
				if err != nil {
					l.Err = err.Error()
				}
				mu.Lock()
				_ = enc.Encode(l)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return 0
}

// dialer is a running dialerMain and the lines it wrote so far.
type dialer struct {
	cgroup string // the pod's cgroup it runs in (unified hierarchy)
	stdin  io.WriteCloser
	cmd    *exec.Cmd
	read   chan struct{}

	mu    sync.Mutex
	lines []dialLine
}

// startDialer starts the dialer in pod's cgroup of the unified hierarchy
// and its network namespace; it is stopped at the test's end at the
// latest.
func startDialer(t *testing.T, pod corev1.Pod, dst netip.AddrPort, workers int, maxFor time.Duration) *dialer {
	t.Helper()
	pid, err := node.TaskPid(t.Context(), pod.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	d := &dialer{read: make(chan struct{})}
	if d.cgroup, err = node.Nodes[0].UnifiedCgroupOf(pid); err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(d.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	d.cmd = exec.Command(os.Args[0])
	d.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=/proc/%d/ns/net %s %d %d", dialerEnv, pid, dst, workers, int(maxFor.Seconds())))
	d.cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	d.cmd.Stderr = os.Stderr
	if d.stdin, err = d.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("dialer in %s: %v", d.cgroup, err)
	}
	go func() {
		defer close(d.read)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l dialLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				d.mu.Lock()
				d.lines = append(d.lines, l)
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(d.stop)
	return d
}

// stop ends the dialer: its workers finish the connection they are in.
func (d *dialer) stop() {
	_ = d.stdin.Close()
	select {
	case <-d.read:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.read
	}
	_ = d.cmd.Wait()
}

// mark is the number of lines so far; since(m) the lines after it.
func (d *dialer) mark() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.lines)
}

func (d *dialer) since(m int) []dialLine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]dialLine(nil), d.lines[m:]...)
}

// waitLines waits until n lines came after mark m, or timeout.
func (d *dialer) waitLines(m, n int, timeout time.Duration) []dialLine {
	for deadline := time.Now().Add(timeout); d.mark()-m < n && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	return d.since(m)
}

// summary counts the lines' answers, failures (with one example each),
// and the local ports of the connections that succeeded.
func tallyDials(lines []dialLine) (names map[string]int, fails map[string]int, ports map[string]bool) {
	names, fails, ports = map[string]int{}, map[string]int{}, map[string]bool{}
	for _, l := range lines {
		if l.Err != "" {
			fails[fmt.Sprintf("%.60s", l.Err)]++
			continue
		}
		names[l.Host]++
		if a, err := netip.ParseAddrPort(l.Local); err == nil {
			ports[strconv.Itoa(int(a.Port()))] = true
		}
	}
	return names, fails, ports
}

// conntrackPorts returns the original source ports of the node
// namespace's conntrack entries towards vip.
func conntrackPorts(t *testing.T, vip netip.Addr) map[string]bool {
	t.Helper()
	out, _, err := node.Sandbox.Node.Exec2("conntrack", "-L", "-d", vip.String())
	if err != nil {
		t.Fatalf("conntrack -L -d %s: %v", vip, err)
	}
	ports := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(l) {
			if p, ok := strings.CutPrefix(f, "sport="); ok {
				ports[p] = true
				break
			}
		}
	}
	return ports
}

// pinsAndLinks returns what the ebpf mode holds on the node: the pins
// under its bpffs (/sys/fs/bpf/steelyard, in the node's mount namespace)
// and the programs attached to cgroup, the node's (cluster.Node.EBPFState).
func pinsAndLinks(t *testing.T, cgroup string) (pins []string, attached []string) {
	t.Helper()
	if own := node.Nodes[0].UnifiedCgroup(); own != cgroup {
		t.Fatalf("pinsAndLinks(%s): the node's cgroup is %s", cgroup, own)
	}
	pins, attached, err := node.Nodes[0].EBPFState(t.Context(), "/sys/fs/bpf/steelyard")
	if err != nil {
		t.Fatal(err)
	}
	return pins, attached
}

// TestHelmEBPFModeOnNode: the chart's mode ebpf on the real node. helm
// upgrade --set mode=ebpf with the node's own cgroup in the unified
// hierarchy (ebpf.cgroupPath: it holds the node's containerd, kubelet and
// pods and nothing else of this machine), under bounded load from a
// process in the client pod's cgroup and network namespace: the 10/90
// split within the binomial tolerance, the application sees the VIP as
// its peer (getpeername), and no conntrack entry of the node carries the
// VIP for those connections (the socket programs served them; in iptables
// mode, before, they do). verify and explain in the pod are clean. Then
// helm upgrade back to iptables: the new agent's first sync detaches and
// unpins everything the ebpf agent left. Not one new connection fails
// across both upgrades. manifests/ is put back at the end.
func TestHelmEBPFModeOnNode(t *testing.T) {
	web(t)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, "web")
	cg := node.Nodes[0].UnifiedCgroup()
	if cg == "" {
		t.Fatal("no cgroup2 mount: --mode ebpf needs one")
	}
	replaceWithChart(t)
	if out, err := helmChart(t.Context(), "install", "-set", fmt.Sprintf("apiServer=%s:%d", node.NodeIP, node.APIPort)); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("helm install: %s", strings.TrimSpace(out))
	}
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	verifyMode(t, "", time.Minute)

	d := startDialer(t, waitReady(t, "app=client", 1, time.Minute)[0], vip, 4, 5*time.Minute)
	t.Logf("the client pod's container in the unified hierarchy: %s (the node's cgroup: %s)", d.cgroup, cg)
	if !strings.HasPrefix(d.cgroup, cg+"/") {
		t.Fatalf("the client pod's cgroup %s is not under the node's %s: the socket programs would not see it", d.cgroup, cg)
	}
	// iptables mode: the same connections go through DNAT, so the check
	// below would see them.
	before := d.waitLines(0, 200, 20*time.Second)
	_, _, ports := tallyDials(before)
	seen := 0
	for p := range conntrackPorts(t, vip.Addr()) {
		if ports[p] {
			seen++
		}
	}
	if seen == 0 {
		t.Fatalf("iptables mode: none of %d connections to %s has a conntrack entry: the check below could not fail", len(ports), vip)
	}
	t.Logf("iptables mode: %d of %d connections through %s have a conntrack entry in the node namespace", seen, len(ports), vip)

	t0 := time.Now()
	out, err := helmChart(t.Context(), "upgrade", "-set", "mode=ebpf", "-set", "ebpf.cgroupPath="+cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade: %s", strings.TrimSpace(out))
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	verifyMode(t, "ebpf", time.Minute)
	pins, attached := pinsAndLinks(t, cg)
	t.Logf("ebpf mode %.1fs after the upgrade: %d programs attached to the node's cgroup %v; pins %v", time.Since(t0).Seconds(), len(attached), attached, pins)
	if len(attached) != 8 {
		t.Fatalf("ebpf mode: %d programs attached to %s, want the 8 socket hooks: %v", len(attached), cg, attached)
	}

	// The iptables mode's entries of closed connections stay (TIME_WAIT,
	// 120 s) and a later connection may reuse a source port: delete them
	// (the node namespace is the test's), so any entry towards the VIP
	// from now on is a connection that was NATed.
	if _, _, err := node.Sandbox.Node.Exec2("conntrack", "-D", "-d", vip.Addr().String()); err != nil {
		t.Logf("conntrack -D -d %s: %v", vip.Addr(), err)
	}
	// The capabilities the ebpf agent runs with, as the kernel shows them:
	// no SYS_ADMIN, PERFMON or SYS_RESOURCE.
	agent := steelyardPod(t)
	apid, err := node.TaskPid(t.Context(), agent.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	st := readProcStatus(t, apid)
	t.Logf("ebpf agent: CapEff %v, CapBnd %v, NoNewPrivs %s, Seccomp %s", st.eff, st.bnd, st.noNewPrivs, st.seccmp)
	if !slices.Equal(st.eff, []string{"NET_ADMIN", "NET_RAW", "BPF"}) {
		t.Errorf("ebpf agent: CapEff %v, want NET_ADMIN NET_RAW BPF", st.eff)
	}

	m := d.mark()
	win := d.waitLines(m, 2000, 60*time.Second)
	names, fails, ports := tallyDials(win)
	ok := names["web-0"] + names["web-1"]
	tol := sandbox.ShareTolerance(10, ok, 4)
	share := 100 * float64(names["web-0"]) / float64(max(ok, 1))
	t.Logf("ebpf mode: %d connections from the client pod: web-0 %.2f%% (want 10 ± %.2f), %v, failed %v", len(win), share, tol, names, fails)
	if ok < 1000 || len(fails) > 0 || ok != len(win) || share < 10-tol || share > 10+tol {
		t.Errorf("ebpf mode: %d of %d connections answered (%v), failed %v; web-0 %.2f%%, want 10 ± %.2f", ok, len(win), names, fails, share, tol)
	}
	for _, l := range win {
		if l.Err == "" && l.Peer != vip.String() {
			t.Errorf("ebpf mode: getpeername gave %s, want the VIP %s", l.Peer, vip)
			break
		}
	}
	var leaked []string
	for p := range conntrackPorts(t, vip.Addr()) {
		if ports[p] {
			leaked = append(leaked, p)
		}
	}
	if len(leaked) > 0 {
		t.Errorf("ebpf mode: %d of %d connections to %s have a conntrack entry in the node namespace (source ports %v): not served by the socket programs", len(leaked), len(ports), vip, leaked[:min(5, len(leaked))])
	}
	ex, err := inSteelyard(t, "steelyard", "explain", "--mode=ebpf")
	if line := lastLineWith(ex, "default/web:http"); err != nil || !strings.Contains(line, "10.00%") || !strings.Contains(line, "90.00%") {
		t.Errorf("explain --mode=ebpf: %v, no 10/90 line for default/web:\n%s", err, ex)
	} else {
		t.Logf("explain: %s", line)
	}

	// CAP_BPF removed: the agent cannot open, load or attach anything
	// (docs/least-privilege.md); the pinned programs keep serving.
	cur, err := node.Client().AppsV1().DaemonSets("steelyard").Get(t.Context(), "steelyard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds := cur.Spec.Template.DeepCopy()
	p := rollout(t, ds, func(tpl *corev1.PodTemplateSpec) { dropCap(agentSpec(t, tpl), "BPF") })
	t.Logf("without CAP_BPF: %s", waitLog(t, p.Name, time.Minute, "not permitted"))
	if podReady(t, p.Name) {
		t.Errorf("without CAP_BPF the agent became Ready")
	}
	restoreDaemonSet(t, ds)
	verifyMode(t, "ebpf", time.Minute)

	t1 := time.Now()
	out, err = helmChart(t.Context(), "upgrade", "-set", "mode=iptables")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm upgrade back: %s", strings.TrimSpace(out))
	kubectl(t, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m")
	verifyMode(t, "", time.Minute)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		pins, attached = pinsAndLinks(t, cg)
		tables, _, _ := node.Sandbox.Node.Exec2("nft", "list", "tables")
		if len(pins) == 0 && len(attached) == 0 && !strings.Contains(tables, "steelyard") {
			t.Logf("back in iptables mode: no pin, no program on the node's cgroup, no nftables table %.1fs after the upgrade", time.Since(t1).Seconds())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the upgrade back: pins %v, attached %v, tables %q", pins, attached, tables)
		}
	}
	time.Sleep(3 * time.Second)
	d.stop()

	all := d.since(0)
	names, fails, _ = tallyDials(all)
	t.Logf("%d connections from the client pod in %.1f s, across both upgrades: %v, failed %v", len(all), float64(all[len(all)-1].MS)/1000, names, fails)
	if len(fails) > 0 {
		t.Errorf("new connections failed across the upgrades: %v", fails)
	}
}

// The dialer's entry point, before TestMain starts a cluster.
func init() {
	if os.Getenv(dialerEnv) != "" {
		os.Exit(dialerMain())
	}
}
