//go:build e2e

package iptables

// A kernel test (root; make e2e): the rendered rules in a sandbox node,
// both iptables flavours. Test IP plan:
//
//	198.18.0.60:80   TCP, weight 1 -> pod a 198.19.5.2:8080, reject weight 1
//	198.19.254.2     the client (off the cluster CIDR: masqueraded)

import (
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestRejectShareKernel: the reject share of a split (a Gateway route's
// invalid backendRef) refuses its connections at once with a reset, for a
// client off the cluster whose packets nat marks for masquerading before
// the split. Before STEELYARD-FORWARD required --ctstate DNAT, it
// accepted that marked SYN and forwarded it to the VIP: each refusal took
// the 1 s SYN retransmission, and 51.44 % of 20,000 connections were
// refused at 1:1 (4.1 sigma), 255 connections/s; after, 49.67 % at
// 5,467/s (load average 15-23 on 2 cores).
func TestRejectShareKernel(t *testing.T) {
	for _, restore := range []string{"iptables-legacy-restore", "iptables-nft-restore"} {
		t.Run(restore, func(t *testing.T) { rejectShareKernel(t, restore) })
	}
}

func rejectShareKernel(t *testing.T, restore string) {
	s := sandbox.NewT(t, sandbox.Options{})
	client, err := s.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddPod("a", netip.MustParseAddr("198.19.5.2"), 8080); err != nil {
		t.Fatal(err)
	}
	if err := s.Node.WriteSysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	sp := svcPort("ns", "gw", "tcp", "198.18.0.60", 80, dataplane.TCP, be("198.19.5.2", 8080, 1))
	sp.RejectWeight = 1
	// The fake renders and keeps what a sync writes, jumps from the
	// built-in chains included; its save goes into the node namespace.
	f := NewFake()
	cfg := Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{sandbox.ClusterCIDR}}}
	if _, err := NewProxier(f, cfg).Sync(dataplane.State{Services: []dataplane.ServicePort{sp}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	save, err := f.SaveAll()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", s.Node.Name, restore)
	cmd.Stdin = strings.NewReader(string(save))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s\n%s", restore, err, out, save)
	}

	// 40,000 connections at 1:1: sigma 0.25 points, 1 point is 4 sigma.
	// The default 2 s timeout: a refusal that waits for a retransmitted
	// SYN still arrives in time, so the error check below is what catches
	// a slow refusal, with the rate.
	const n = 40000
	r, err := client.TCPConns(netip.MustParseAddrPort("198.18.0.60:80"), n, sandbox.Load{Concurrency: 128, MaxDuration: time.Minute})
	if err != nil {
		t.Fatalf("%v: %v", err, r)
	}
	t.Logf("%v", r)
	answered := 100 * float64(r.Counts["a"]) / float64(max(r.Attempted, 1))
	tol := sandbox.ShareTolerance(50, n, 4)
	if r.Attempted != n || len(r.Counts) != 1 || answered < 50-tol || answered > 50+tol {
		t.Errorf("a answered %.2f%% of %d, want 50%% within %.2f points", answered, r.Attempted, tol)
	}
	if refused := r.Errors["connection refused"]; refused != r.Failed() {
		t.Errorf("%d of %d failed connections not refused: %v", r.Failed()-refused, r.Failed(), r.Errors)
	}
	// 20 single dials: each refusal must come at once, not after the SYN
	// retransmitted a second later (20 dials took 7-8 s before).
	one, err := client.TCPConns(netip.MustParseAddrPort("198.18.0.60:80"), 20, sandbox.Load{Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("single dials: %v", one)
	if one.Elapsed.Seconds() > 2 {
		t.Errorf("20 single dials took %v: refusals wait for a retransmitted SYN", one.Elapsed)
	}
}
