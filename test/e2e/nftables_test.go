//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// The nftables dataplane (--mode nftables) in the sandbox's node namespace:
// shares over real connections, reject, a weight change, explain/verify,
// cleanup. The fixture's own helpers speak --mode iptables, so this file
// has its nftables twins.

var nftArgs = []string{"--mode", "nftables"}

// nftStart runs the agent in nftables mode and waits for verify to pass.
func nftStart(f *fixture) {
	f.t.Helper()
	args := append([]string{"run", "--manifests", f.dir, "--log-level", "debug", "--cluster-cidr", sandbox.ClusterCIDR.String()}, nftArgs...)
	a, err := f.sb.StartAgent(steelyardBin, args...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.agent = a
	start := time.Now()
	nftWaitVerify(f, 20*time.Second)
	for !agentSynced(a.Log()) {
		if exited, err := a.Exited(); exited {
			f.t.Fatalf("agent exited: %v", err)
		}
		if time.Since(start) > 20*time.Second {
			f.t.Fatal("the agent never logged its first sync")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.t.Logf("agent ready in nftables mode %s after start", time.Since(start).Round(time.Millisecond))
}

func nftVerify(f *fixture) (string, int) {
	stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin, "verify", "--manifests", f.dir}, nftArgs...)...)
	return stdout + stderr, sandbox.ExitCode(err)
}

func nftWaitVerify(f *fixture, timeout time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if exited, err := f.agent.Exited(); exited {
			f.t.Fatalf("agent exited: %v\n%s", err, f.agent.Log())
		}
		out, code := nftVerify(f)
		if code == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("verify --mode nftables still fails after %s (exit %d):\n%s", timeout, code, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func nftExplain(f *fixture) []dataplane.ServiceView {
	f.t.Helper()
	out, err := f.steelyard(append([]string{"explain", "-o", "json"}, nftArgs...)...)
	if err != nil {
		f.t.Fatalf("explain: %v", err)
	}
	var views []dataplane.ServiceView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		f.t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	return views
}

func TestNftables(t *testing.T) {
	empty := svc{name: "nft-empty", vip: "198.18.0.14", port: 80, targetPort: 8080}
	f := newFixture(t, "")
	f.addPods(webService, quadService, dnsService)
	f.write("services.yaml", webService, quadService, dnsService, empty)
	nftStart(f)

	tables, err := f.sb.Node.Exec("nft", "list", "tables")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tables, "table ip steelyard") {
		t.Fatalf("no steelyard table: %s", tables)
	}
	if text, err := f.steelyard(append([]string{"explain"}, nftArgs...)...); err == nil {
		t.Logf("explain --mode nftables:\n%s", text)
	}
	views := nftExplain(f)
	if got := viewcheck.Shares(viewcheck.Find(views, webService.vip, 80)); !viewcheck.Same(got, map[string]float64{"198.19.1.2": 10, "198.19.1.3": 90}) {
		t.Errorf("explain web: %v, want 10/90", got)
	}
	if v := viewcheck.Find(views, empty.vip, 80); v == nil || !v.Reject {
		t.Errorf("explain %s: %+v, want reject", empty.vip, v)
	}

	t.Run("TCP 10/90", func(t *testing.T) {
		r, err := f.client.TCPConns(addrPort(webService.vip, 80), 10000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("10/90: %s", r)
		expectShares(t, r, map[string]float64{"web-1": 10, "web-2": 90}, 1.5)
	})
	t.Run("TCP 1:2:3:4", func(t *testing.T) {
		r, err := f.client.TCPConns(addrPort(quadService.vip, 80), tcp1234Conns, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("1:2:3:4: %s", r)
		expectShares(t, r, map[string]float64{"quad-1": 10, "quad-2": 20, "quad-3": 30, "quad-4": 40}, 1)
	})
	t.Run("UDP 10/90", func(t *testing.T) {
		r, err := f.client.UDPFlows(addrPort(dnsService.vip, 53), udp1090Flows, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("UDP 10/90: %s", r)
		expectShares(t, r, map[string]float64{"dns-1": 10, "dns-2": 90}, 2)
	})
	t.Run("no endpoints: refused", func(t *testing.T) {
		for _, origin := range []string{"client", "node"} {
			ns := map[string]*sandbox.NS{"client": f.client, "node": f.sb.Node}[origin]
			took, err := ns.Dial("tcp", addrPort(empty.vip, 80), time.Second)
			t.Logf("tcp from the %s: %v after %s", origin, err, took.Round(time.Microsecond))
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("from the %s: %v, want ECONNREFUSED", origin, err)
			} else if took > 100*time.Millisecond {
				t.Errorf("from the %s: refused after %s, want within 100ms", origin, took)
			}
		}
	})
	t.Run("weight change", func(t *testing.T) {
		changed := webService
		changed.annotations = map[string]string{"steelyard.io/weights": "web-1=70,web-2=30"}
		f.write("services.yaml", changed, quadService, dnsService, empty)
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := viewcheck.Shares(viewcheck.Find(nftExplain(f), webService.vip, 80))
			if viewcheck.Same(got, map[string]float64{"198.19.1.2": 70, "198.19.1.3": 30}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("explain web after the change: %v, want 70/30", got)
			}
			time.Sleep(100 * time.Millisecond)
		}
		nftWaitVerify(f, 10*time.Second)
		// 3,000 connections: sigma(30%) = 0.84 points, 4 points = 4.8 sigma.
		r, err := f.client.TCPConns(addrPort(webService.vip, 80), 3000, sandbox.Load{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("70/30: %s", r)
		expectShares(t, r, map[string]float64{"web-1": 70, "web-2": 30}, 4)
	})
	t.Run("cleanup", func(t *testing.T) {
		if err := f.agent.Stop(); err != nil {
			t.Logf("agent stop: %v", err)
		}
		// A neighbour table that cleanup must leave alone.
		if _, err := f.sb.Node.Exec("nft", "add table ip neighbour"); err != nil {
			t.Fatal(err)
		}
		if out, err := f.steelyard(append([]string{"cleanup"}, nftArgs...)...); err != nil {
			t.Fatalf("cleanup: %v\n%s", err, out)
		}
		tables, err := f.sb.Node.Exec("nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(tables, "steelyard") || !strings.Contains(tables, "neighbour") {
			t.Errorf("after cleanup: %s", tables)
		}
		if v := nftExplain(f); len(v) != 0 {
			t.Errorf("explain after cleanup: %v", v)
		}
	})
}
