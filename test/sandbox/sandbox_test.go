//go:build e2e

// These tests check the sandbox itself, without the agent: a hand-made DNAT
// ruleset in the node namespace stands in for steelyard. Run as root:
//
//	go test -tags e2e ./test/sandbox/
//
// Test IP plan (see the package comment for the topology):
//
//	198.18.0.99:80   TCP+UDP, 25% -> pod a 198.19.1.2:8080, 75% -> pod b 198.19.1.3:8080
//	198.18.0.98:80   TCP -> pod h 198.19.1.4:8080 only (hairpin)
//	198.18.0.97:80   REJECT (a VIP without endpoints)
//	198.19.254.2     the client
package sandbox

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	vipSplit   = netip.MustParseAddr("198.18.0.99")
	vipHairpin = netip.MustParseAddr("198.18.0.98")
	vipReject  = netip.MustParseAddr("198.18.0.97")
	podA       = netip.MustParseAddr("198.19.1.2")
	podB       = netip.MustParseAddr("198.19.1.3")
	podH       = netip.MustParseAddr("198.19.1.4")
)

// handMadeRules is a minimal kube-proxy-like ruleset, applied with
// iptables-restore inside the node namespace only.
const handMadeRules = `*nat
:SBX-SVC - [0:0]
-A PREROUTING -j SBX-SVC
-A OUTPUT -j SBX-SVC
-A SBX-SVC -d 198.18.0.99/32 -p tcp --dport 80 -m statistic --mode random --probability 0.25 -j DNAT --to-destination 198.19.1.2:8080
-A SBX-SVC -d 198.18.0.99/32 -p tcp --dport 80 -j DNAT --to-destination 198.19.1.3:8080
-A SBX-SVC -d 198.18.0.99/32 -p udp --dport 80 -m statistic --mode random --probability 0.25 -j DNAT --to-destination 198.19.1.2:8080
-A SBX-SVC -d 198.18.0.99/32 -p udp --dport 80 -j DNAT --to-destination 198.19.1.3:8080
-A SBX-SVC -d 198.18.0.98/32 -p tcp --dport 80 -j DNAT --to-destination 198.19.1.4:8080
-A POSTROUTING -s 198.19.1.4/32 -d 198.19.1.4/32 -j MASQUERADE
COMMIT
*filter
-A FORWARD -d 198.18.0.97/32 -j REJECT
-A OUTPUT -d 198.18.0.97/32 -j REJECT
COMMIT
`

func newHandMade(t *testing.T) (*Sandbox, *NS) {
	s := NewT(t, Options{})
	client, err := s.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	for name, ip := range map[string]netip.Addr{"a": podA, "b": podB, "h": podH} {
		if _, err := s.AddPod(name, ip, 8080); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Node.WriteSysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", s.Node.Name, "iptables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(handMadeRules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore in %s: %v: %s", s.Node.Name, err, out)
	}
	return s, client
}

// within fails unless got is within tol points of want.
func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s: %.2f%%, want %.2f%% ± %.1f", what, got, want, tol)
	}
}

func TestTopologyAndTraffic(t *testing.T) {
	s, client := newHandMade(t)

	// The node itself reaches pods directly and VIPs through OUTPUT.
	if r, err := s.Node.TCPConns(netip.AddrPortFrom(podA, 8080), 10, Load{}); err != nil || r.Counts["a"] != 10 {
		t.Errorf("node -> pod a: %v %v", r, err)
	}
	if r, err := s.Node.TCPConns(netip.AddrPortFrom(vipSplit, 80), 200, Load{}); err != nil || r.OK() != 200 {
		t.Errorf("node -> VIP: %v %v", r, err)
	}

	// 4,000 connections at 25/75: sd = sqrt(.25*.75/4000) = 0.68 points,
	// so 3 points is 4.4 sd.
	r, err := client.TCPConns(netip.AddrPortFrom(vipSplit, 80), 4000, Load{})
	t.Log(r)
	if err != nil || r.Failed() > 0 {
		t.Fatalf("tcp: %v %v", r, err)
	}
	within(t, "tcp a", r.Share("a"), 25, 3)
	within(t, "tcp b", r.Share("b"), 75, 3)
	if got := s.Pod("a").Accepted() + s.Pod("b").Accepted(); got < 4000 {
		t.Errorf("pods accepted %d connections, want >= 4000", got)
	}

	// 2,000 UDP flows: sd 0.97 points, 4 points is 4.1 sd.
	u, err := client.UDPFlows(netip.AddrPortFrom(vipSplit, 80), 2000, Load{})
	t.Log(u)
	if err != nil || u.Failed() > 0 {
		t.Fatalf("udp: %v %v", u, err)
	}
	within(t, "udp a", u.Share("a"), 25, 4)

	// A long-lived connection echoes.
	c, err := client.Connect(netip.AddrPortFrom(vipSplit, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.Echo("line "+strconv.Itoa(i), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()

	// Hairpin: h reaches itself through the VIP (needs the MASQUERADE).
	h := s.Pod("h")
	hr, err := h.NS.TCPConns(netip.AddrPortFrom(vipHairpin, 80), 20, Load{})
	if err != nil || hr.Counts["h"] != 20 {
		t.Errorf("hairpin: %v %v", hr, err)
	}
}

func TestRefusal(t *testing.T) {
	_, client := newHandMade(t)
	for _, proto := range []string{"tcp", "udp"} {
		took, err := client.Dial(proto, netip.AddrPortFrom(vipReject, 80), time.Second)
		t.Logf("%s refused after %s: %v", proto, took, err)
		if !errors.Is(err, syscall.ECONNREFUSED) || took > 100*time.Millisecond {
			t.Errorf("%s to a rejected VIP: %v after %s, want ECONNREFUSED within 100ms", proto, err, took)
		}
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	RequireRoot(t)
	// A leftover of a dead owner: PID of a process that has exited.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	stale := "sy" + strconv.Itoa(dead) + "-1-node"
	if processAlive(dead) {
		t.Skipf("pid %d was reused", dead)
	}
	if out, err := exec.Command("ip", "netns", "add", stale).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	s, err := New(Options{Logf: t.Logf})
	if err != nil {
		exec.Command("ip", "netns", "delete", stale).Run()
		t.Fatal(err)
	}
	if _, err := os.Stat(netnsDir + "/" + stale); !errors.Is(err, os.ErrNotExist) {
		exec.Command("ip", "netns", "delete", stale).Run()
		t.Errorf("leftover %s was not removed", stale)
	}
	if _, err := s.AddClient(netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddPod("p", podA, 8080); err != nil {
		t.Fatal(err)
	}
	// A documentation-range address (TEST-NET-1): never configured, only refused.
	if _, err := s.AddPod("bad", netip.MustParseAddr("192.0.2.3"), 8080); err == nil {
		t.Error("AddPod accepted an address outside 198.19.0.0/16")
	}
	if _, err := s.Node.TCPConns(netip.MustParseAddrPort("127.0.0.1:80"), 1, Load{}); err == nil {
		t.Error("TCPConns accepted a destination outside 198.18.0.0/15")
	}
	names := []string{}
	for _, n := range s.namespaces {
		names = append(names, n.Name)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if _, err := os.Stat(netnsDir + "/" + n); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s survived Close", n)
		}
	}
	// The root namespace never saw an interface of ours.
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && (strings.HasPrefix(f[1], "syc") || strings.HasPrefix(f[1], "syp") || strings.HasPrefix(f[1], NodeDummy)) {
			t.Errorf("root namespace has %s", l)
		}
	}
}
