//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// The ebpf mode's cgroup and bpffs. The socket programs attach to a cgroup
// v2 directory and balance the sockets of its processes, whatever network
// namespace they are in: every client and pod socket of this suite is made
// by the test process itself (sandbox.NS.Do), so TestMain moves the test
// process into a sub-cgroup of its own, which the agent (a child) inherits,
// and the ebpf mode attaches there only. Never to the unified root: that
// would change every process on the machine.
//
// The pins go to a bpffs the suite mounts on a directory of its own (this
// host has none at /sys/fs/bpf, and `ip netns exec` mounts a fresh /sys
// anyway, which is also why the agent reaches the sub-cgroup through
// /proc/<pid>/root);
// each case's fixture removes every pin when it ends (the programs detach
// with their last link), and TestMain unmounts and removes both at the end.
const cgroupPrefix = "steelyard-e2e-"

var (
	ebpfPins string
	// cgroupUnified is the cgroup2 mount (sandbox.UnifiedRoot): this
	// host's hybrid /sys/fs/cgroup/unified, or /sys/fs/cgroup in the VM
	// (`make ebpf-vm`, Debian's 6.1 kernel).
	cgroupUnified string
)

// setupEBPF creates the sub-cgroup and the bpffs, moves the test process
// in, and sets the ebpf mode's arguments; the returned function undoes it
// all.
func setupEBPF() (func(), error) {
	root, err := sandbox.UnifiedRoot()
	if err != nil {
		return nil, fmt.Errorf("ebpf: %w", err)
	}
	cgroupUnified = root
	removeDeadCgroups()
	cg := filepath.Join(cgroupUnified, fmt.Sprintf("%s%d", cgroupPrefix, os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		return nil, fmt.Errorf("ebpf: sub-cgroup: %w", err)
	}
	orig, err := sandbox.OwnCgroup()
	if err != nil {
		os.Remove(cg)
		return nil, err
	}
	parent, err := os.MkdirTemp("", "steelyard-e2e-ebpf-")
	if err != nil {
		os.Remove(cg)
		return nil, err
	}
	dir := filepath.Join(parent, "bpffs")
	os.Mkdir(dir, 0o700)
	// `ip netns exec` mounts a fresh /sys without the cgroup mounts: the
	// agent reaches the sub-cgroup through this process's root
	// (/proc/<pid>/root resolves in this process's mount namespace). Not
	// a bind mount: another suite that lists the cgroup mounts of the
	// host (test/node/cluster) would take it for a hierarchy of its own.
	cgPath := fmt.Sprintf("/proc/%d/root%s", os.Getpid(), cg)
	undo := func() {
		clearPins()
		syscall.Unmount(dir, syscall.MNT_DETACH)
		os.Remove(dir)
		os.Remove(parent)
		// Back to where the process was, then the cgroup is empty.
		os.WriteFile(filepath.Join(cgroupUnified, orig, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
		// A process of the suite that is still exiting keeps the cgroup
		// busy for a moment (EBUSY seen after long runs).
		var err error
		for range 100 {
			if err = os.Remove(cg); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: remove", cg+":", err)
		}
	}
	if err := syscall.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		undo()
		return nil, fmt.Errorf("ebpf: mount a bpffs: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		undo()
		return nil, fmt.Errorf("ebpf: move the test process into %s: %w", cg, err)
	}
	ebpfPins = filepath.Join(dir, "steelyard")
	for i := range dpModes {
		if dpModes[i].name == "ebpf" {
			dpModes[i].args = []string{"--mode", "ebpf", "--cgroup-path", cgPath, "--bpf-pin-dir", ebpfPins}
		}
	}
	return undo, nil
}

// clearPins removes every pin of the ebpf mode (a case's end): what the
// agent attached detaches, and the next case starts with no tables.
func clearPins() {
	if ebpfPins != "" {
		os.RemoveAll(ebpfPins)
	}
}

// removeDeadCgroups removes the sub-cgroups of test processes that died
// (killed before their cleanup ran); a cgroup that still has processes
// refuses.
func removeDeadCgroups() {
	entries, _ := os.ReadDir(cgroupUnified)
	for _, e := range entries {
		pid, err := strconv.Atoi(strings.TrimPrefix(e.Name(), cgroupPrefix))
		if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) || err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		os.Remove(filepath.Join(cgroupUnified, e.Name()))
	}
}

// TestEBPFSocketLB checks what only the ebpf mode does: the backend is
// chosen at the socket, so no packet carries the VIP (the node's conntrack
// never sees it), while the application still sees the VIP as its peer
// (getpeername) and as the source of unconnected UDP replies (recvmsg);
// each datagram's choice is counted (--count-connections) and the counts
// go when the agent runs without it; and `cleanup --mode ebpf` detaches
// the programs and unpins the maps.
func TestEBPFSocketLB(t *testing.T) {
	f := newFixture(t, modeNamed(t, "ebpf"))
	f.addPods(webService, dnsService)
	f.write("services.yaml", webService, dnsService)
	f.start("--count-connections")

	r, err := f.client.TCPConns(addrPort(webService.vip, 80), 2000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed() > 0 {
		t.Errorf("%d of 2000 connections failed: %s", r.Failed(), r)
	}
	out, _, err := f.sb.Node.Exec2("conntrack", "-L")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "dst="+webService.vip+" ") {
		t.Errorf("the node's conntrack saw the VIP:\n%s", out)
	}
	if !strings.Contains(out, "dst=198.19.1.") {
		t.Errorf("the node's conntrack has no connection to a web pod (a check that cannot fail otherwise):\n%s", out)
	}

	c, err := f.client.Connect(addrPort(webService.vip, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RemoteAddr().String(); got != "198.18.0.10:80" {
		t.Errorf("getpeername: %s, want the VIP 198.18.0.10:80", got)
	}
	c.Close()

	// Unconnected UDP: one socket, udp1090Flows datagrams sent to the VIP
	// one at a time. Each sendmsg() chooses again, so the 10/90 split holds
	// per datagram (the tolerance of caseUDPShares), and every reply comes
	// from the VIP (recvmsg).
	res := sandbox.Result{Dst: addrPort(dnsService.vip, 53), Proto: "udp", Requested: udp1090Flows,
		Counts: map[string]int{}, Errors: map[string]int{}}
	start := time.Now()
	err = f.client.Do(func() error {
		pc, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer pc.Close()
		vip := net.UDPAddrFromAddrPort(res.Dst)
		buf := make([]byte, 256)
		for range udp1090Flows {
			res.Attempted++
			pc.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := pc.WriteToUDP([]byte("hello\n"), vip); err != nil {
				return err
			}
			n, from, err := pc.ReadFromUDPAddrPort(buf)
			if err != nil {
				res.Errors[err.Error()]++
				continue
			}
			if from != res.Dst {
				res.Errors["reply from "+from.String()]++
				continue
			}
			res.Counts[strings.TrimSpace(string(buf[:n]))]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res.Elapsed = time.Since(start)
	sandbox.ExpectShares(t, res, map[string]float64{"dns-1": 10, "dns-2": 90}, 2)
	out, _, err = f.sb.Node.Exec2("conntrack", "-L", "-p", "udp")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "dst="+dnsService.vip+" ") || !strings.Contains(out, "dst=198.19.4.") {
		t.Errorf("the node's conntrack: want dns pods and never the VIP:\n%s", out)
	}
	// Counted at the socket, one per sendmsg(): the total is every datagram
	// sent, and each backend's count the replies it sent (a lost reply
	// leaves its datagram counted where the client cannot tell).
	obs := f.observed(dnsService.vip, 53)
	t.Logf("observed at the socket: %+v", obs)
	if obs.Total != uint64(res.Attempted) {
		t.Errorf("counted %d datagrams' choices, the client sent %d", obs.Total, res.Attempted)
	}
	names := map[string]string{}
	for _, p := range dnsService.endpoints {
		names[p.ip] = p.name
	}
	if res.Failed() == 0 {
		viewcheck.ExpectObserved(t, obs, res, names, map[string]float64{"dns-1": 10, "dns-2": 90}, 2)
	} else {
		for _, b := range obs.Backends {
			if got := int(b.Count); got < res.Counts[names[b.IP]] || got > res.Counts[names[b.IP]]+res.Failed() {
				t.Errorf("%s: counted %d, the client got %d replies from it (%d lost)", b.IP, got, res.Counts[names[b.IP]], res.Failed())
			}
		}
	}

	// A restart moves the pinned links to the new programs: still one
	// attachment per hook, on the suite's cgroup.
	if err := f.agent.Stop(); err != nil {
		t.Logf("agent stop: %v", err)
	}
	f.start()
	if strings.Contains(f.agent.Log(), "another cgroup") {
		t.Errorf("the restarted agent found its links on another cgroup:\n%s", f.agent.Log())
	}
	// Restarted without --count-connections: the counters are gone.
	if obs := f.observed(dnsService.vip, 53); obs.Total != 0 {
		t.Errorf("after a restart without --count-connections: %d still counted", obs.Total)
	}
	cg := f.modeArgs()[slices.Index(f.modeArgs(), "--cgroup-path")+1]
	out, err = f.sb.Node.Exec("bpftool", "cgroup", "show", cg)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out, " sy_"); n != 8 {
		t.Errorf("bpftool cgroup show: %d steelyard programs, want 8 (one per hook):\n%s", n, out)
	}
	if err := f.agent.Stop(); err != nil {
		t.Logf("agent stop: %v", err)
	}
	if out, err := f.steelyard(append([]string{"cleanup"}, f.modeArgs()...)...); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	if _, err := os.Stat(ebpfPins); !os.IsNotExist(err) {
		t.Errorf("pin dir %s after cleanup: %v", ebpfPins, err)
	}
	// Detached: the connect goes to the VIP itself, which nothing serves
	// any more (the node routes it to its dummy interface).
	if _, err := f.client.Dial("tcp", addrPort(webService.vip, 80), 500*time.Millisecond); err == nil {
		t.Error("a connection to the VIP succeeded after cleanup")
	}
	if out, err := f.sb.Node.Exec("bpftool", "cgroup", "show", cg); err != nil || strings.Contains(out, "sy_") {
		t.Errorf("bpftool cgroup show after cleanup (%v):\n%s", err, out)
	}
}

// TestEBPFAffinityFollowsEndpoints: sessionAffinity ClientIP at the socket
// keeps a client on its pod through changes of the Service's other
// endpoints, and never returns a pod that left or whose weight became 0
// (the members map), within a timeout (300 s) far longer than the test.
// 50 connections of one unbound client each time: without affinity all
// 50 on one of two equal pods has probability 2^-49.
func TestEBPFAffinityFollowsEndpoints(t *testing.T) {
	one := pEndpoint{name: "stick-1", ip: "198.19.40.2"}
	two := pEndpoint{name: "stick-2", ip: "198.19.40.3"}
	svcOf := func(weights string, eps ...pEndpoint) pService {
		return pService{name: "stick", clusterIPs: []string{"198.18.0.40"}, port: 80, targetPort: 8080, weights: weights, endpoints: eps,
			tweak: func(s *corev1.Service) {
				s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
				sec := int32(300)
				s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
			}}
	}
	f := newFixture(t, modeNamed(t, "ebpf"))
	f.addSourcePods(svcOf("", one, two))
	f.writeParity("stick.yaml", svcOf("", one, two))
	f.start()
	sticky := func(when string) string {
		t.Helper()
		r, err := f.client.TCPConnsAny(ap("198.18.0.40:80"), 50, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", when, r)
		if len(r.Counts) != 1 || r.Failed() > 0 {
			t.Fatalf("%s: one client reached %v (failed %d), want one pod", when, r.Counts, r.Failed())
		}
		for name := range r.Counts {
			return name
		}
		return ""
	}
	change := func(s pService) {
		t.Helper()
		f.writeParity("stick.yaml", s)
		f.waitVerify(20 * time.Second)
	}

	first := sticky("start")
	stay, other := one, two
	if first == two.name {
		stay, other = two, one
	}
	// Its pod leaves: the client goes to the other one.
	change(svcOf("", other))
	if got := sticky(first + " left"); got != other.name {
		t.Errorf("after %s left the client reached %s, want %s", first, got, other.name)
	}
	// It comes back: the client keeps the pod it has now.
	change(svcOf("", one, two))
	if got := sticky(first + " back"); got != other.name {
		t.Errorf("after %s came back the client moved to %s, want it kept on %s", first, got, other.name)
	}
	// That pod goes to weight 0: the client moves back.
	change(svcOf(other.name+"=0,"+stay.name+"=1", one, two))
	if got := sticky(other.name + " at weight 0"); got != stay.name {
		t.Errorf("with %s at weight 0 the client reached %s, want %s", other.name, got, stay.name)
	}
	// All of it at the socket: no packet carried the VIP.
	out, _, err := f.sb.Node.Exec2("conntrack", "-L", "-p", "tcp")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "dst=198.18.0.40 ") || !strings.Contains(out, "dst=198.19.40.") {
		t.Errorf("the node's conntrack: want the stick pods and never the VIP:\n%s", out)
	}
}
