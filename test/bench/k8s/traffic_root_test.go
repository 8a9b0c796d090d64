//go:build e2e

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// TestTrafficClientHelper is the client child when the test binary runs
// itself (TRAFFIC_CLIENT=1); otherwise it does nothing.
func TestTrafficClientHelper(t *testing.T) {
	if os.Getenv("TRAFFIC_CLIENT") != "1" {
		return
	}
	os.Exit(trafficClient(os.Stdin, os.Stdout))
}

// TestTrafficStaticDNAT runs the traffic phase's client and backends in a
// sandbox without a proxy or an API server: a static nftables DNAT in the
// node namespace stands for the VIP (10/90 by numgen). It checks the phase
// measures both paths and the split, in seconds, as root:
//
//	go test -tags e2e -run TestTrafficStaticDNAT -v ./test/bench/k8s
//
// (make e2e runs it.) The ratios it logs on this machine: VIP / direct
// new-connection req/s 0.97-0.99x over four runs at load 6-13, no request
// over 100 ms.
func TestTrafficStaticDNAT(t *testing.T) {
	sandbox.RequireRoot(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	old := trafficClientArgv
	trafficClientArgv = func() ([]string, error) {
		return []string{"env", "TRAFFIC_CLIENT=1", exe, "-test.run=^TestTrafficClientHelper$"}, nil
	}
	defer func() { trafficClientArgv = old }()

	s := trafficSandbox(t, "sykt")
	rules := filepath.Join(t.TempDir(), "vip.nft")
	if err := os.WriteFile(rules, []byte(fmt.Sprintf(`table ip trafficvip {
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr 198.18.0.99 tcp dport 80 dnat ip to numgen random mod 10 map { 0 : %s . %d, 1-9 : %s . %d }
	}
}
`, trafficBackends[0], endpointPort, trafficBackends[1], endpointPort)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Node.Exec("nft", "-f", rules); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	job := trafficJob{VIP: "198.18.0.99:80", Direct: fmt.Sprintf("%s:%d", trafficBackends[0], endpointPort),
		Conns: 1000, Limit: time.Minute, Duration: 3 * time.Second, Workers: 2, Ready: 10 * time.Second, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := runTrafficClient(ctx, s.Node.Name, "", job)
	if err != nil || out.Error != "" {
		t.Fatalf("client: %v %s", err, out.Error)
	}
	tr := &trafficResult{weighted: true, out: out}
	t.Logf("%s", tr.summary())
	t.Logf("VIP / direct: new-connection req/s %.2fx, keepalive %.2fx", ratio(out.NewVIP.perSecond(), out.NewDirect.perSecond()), ratio(out.KeepVIP.perSecond(), out.KeepDirect.perSecond()))
	t.Logf("new VIP %+v\nnew direct %+v\nkeepalive VIP %+v\nkeepalive direct %+v", out.NewVIP, out.NewDirect, out.KeepVIP, out.KeepDirect)
	if !tr.measured() || len(out.FirstVIP) != job.Conns || len(out.FirstDirect) != job.Conns {
		t.Errorf("measured %v: %d / %d first-byte samples, want %d", tr.measured(), len(out.FirstVIP), len(out.FirstDirect), job.Conns)
	}
	share, n := tr.shareA()
	if tol := sandbox.ShareTolerance(10, n, 4); share < 10-tol || share > 10+tol {
		t.Errorf("backend a %.2f%% of %d new connections through the VIP, want 10 ± %.2f", share, n, tol)
	}

	// The end of the phase: waitVIPGone waits while the VIP answers and
	// returns once the rule is gone.
	vip := netip.MustParseAddrPort(job.VIP)
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if err := waitVIPGone(wctx, s.Node, nil, vip); err == nil || !strings.Contains(err.Error(), "still answers") {
		t.Errorf("waitVIPGone with the rule in place: %v, want still answers", err)
	}
	if out, err := s.Node.Exec("nft", "delete", "table", "ip", "trafficvip"); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	wctx, wcancel = context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := waitVIPGone(wctx, s.Node, nil, vip); err != nil {
		t.Errorf("waitVIPGone after the rule's deletion: %v", err)
	}
}

// trafficSandbox makes a sandbox with the two traffic backends serving in
// pods (closed at the test's end) and the node's client sysctls set.
func trafficSandbox(t *testing.T, prefix string) *sandbox.Sandbox {
	t.Helper()
	s := sandbox.NewT(t, sandbox.Options{Prefix: prefix})
	for i, ip := range trafficBackends {
		id := byte('a' + i)
		pod, err := s.AddPod(fmt.Sprintf("traffic-%c", id), ip)
		if err != nil {
			t.Fatal(err)
		}
		var l net.Listener
		if err := pod.NS.Do(func() (err error) {
			l, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", endpointPort))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		b := serveBackend(l, id)
		t.Cleanup(b.close)
	}
	if err := trafficNodeSysctls(s.Node); err != nil {
		t.Fatal(err)
	}
	return s
}
