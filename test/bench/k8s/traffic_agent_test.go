//go:build e2e

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// trafficManifest is the traffic Service for the agent's --manifests
// source: a fixed VIP, the phase's two backends at 10/90.
var trafficManifest = fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  namespace: bench
  name: traffic
  annotations:
    steelyard.io/weights: "%[1]s=10,%[2]s=90"
spec:
  clusterIP: 198.18.0.99
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: %[3]d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: bench
  name: traffic-1
  labels:
    kubernetes.io/service-name: traffic
addressType: IPv4
ports:
  - {name: http, protocol: TCP, port: %[3]d}
endpoints:
  - addresses: ["%[1]s"]
    conditions: {ready: true, serving: true, terminating: false}
  - addresses: ["%[2]s"]
    conditions: {ready: true, serving: true, terminating: false}
`, trafficBackends[0], trafficBackends[1], endpointPort)

// TestTrafficAgentModes runs the traffic phase's client against the
// steelyard agent in nftables and ebpf mode (--manifests, no API server),
// one Service: both paths measured, the 10/90 split through the VIP, and
// in ebpf mode the client moved into the sub-cgroup the socket programs
// are attached to (the test process stays outside it), which is the only
// way its connections to the VIP can reach a backend. The first-byte
// figures are logged, not asserted.
func TestTrafficAgentModes(t *testing.T) {
	sandbox.RequireRoot(t)
	bin, cleanup, err := sandbox.AgentBinary("traffic")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	old := trafficClientArgv
	trafficClientArgv = func() ([]string, error) {
		return []string{"env", "TRAFFIC_CLIENT=1", exe, "-test.run=^TestTrafficClientHelper$"}, nil
	}
	defer func() { trafficClientArgv = old }()
	p50 := map[string]time.Duration{}
	for _, mode := range []string{"nftables", "ebpf"} {
		t.Run(mode, func(t *testing.T) {
			out := trafficAgentRun(t, bin, mode)
			tr := &trafficResult{weighted: true, out: out}
			t.Logf("%s", tr.summary())
			if !tr.measured() {
				t.Fatalf("not measured: %+v", out)
			}
			share, n := tr.shareA()
			if tol := sandbox.ShareTolerance(10, n, 4); share < 10-tol || share > 10+tol {
				t.Errorf("backend a %.2f%% of %d new connections through the VIP, want 10 ± %.2f", share, n, tol)
			}
			p50[mode], _ = tr.firstByte(false, 0.5)
		})
	}
	if p50["nftables"] > 0 && p50["ebpf"] > 0 {
		t.Logf("first byte p50 through the VIP, ebpf / nftables: %.2fx (one Service)", ratio(p50["ebpf"].Seconds(), p50["nftables"].Seconds()))
	}
}

func trafficAgentRun(t *testing.T, bin, mode string) trafficOutput {
	s := trafficSandbox(t, "syka")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "traffic.yaml"), []byte(trafficManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--manifests", dir, "--mode", mode, "--cluster-cidr", sandbox.ClusterCIDR.String(),
		"--metrics-bind-address", "", "--healthz-bind-address", ""}
	cgroup := ""
	if mode == "ebpf" {
		var pin string
		cgroup, pin = trafficEBPFEnv(t)
		args = append(args, "--cgroup-path", fmt.Sprintf("/proc/%d/root%s", os.Getpid(), cgroup), "--bpf-pin-dir", pin)
	}
	a, err := s.StartAgent(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	// Before the pins go (trafficEBPFEnv's cleanup runs later).
	t.Cleanup(func() { a.Stop() })
	job := trafficJob{VIP: "198.18.0.99:80", Direct: fmt.Sprintf("%s:%d", trafficBackends[0], endpointPort),
		Conns: 500, Limit: time.Minute, Duration: 2 * time.Second, Workers: 2, Ready: time.Minute, Timeout: 2 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := runTrafficClient(ctx, s.Node.Name, cgroup, job)
	if err != nil || out.Error != "" {
		t.Fatalf("client: %v %s\nagent log:\n%s", err, out.Error, lastLines(a.Log(), 30))
	}
	if mode == "ebpf" && "/sys/fs/cgroup/unified"+out.Cgroup != cgroup {
		t.Errorf("the client ran in cgroup %q, want %s", out.Cgroup, cgroup)
	}
	return out
}

// trafficEBPFEnv makes a sub-cgroup of the unified hierarchy (never its
// root) and a bpffs for the pins; the test's cleanup removes both.
func trafficEBPFEnv(t *testing.T) (cgroup, pinDir string) {
	cgroup = filepath.Join("/sys/fs/cgroup/unified", fmt.Sprintf("steelyard-traffic-%d", os.Getpid()))
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The client has exited; a process still exiting keeps the
		// cgroup busy for a moment.
		var err error
		for range 50 {
			if err = os.Remove(cgroup); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("remove %s: %v", cgroup, err)
		}
	})
	mnt := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	pinDir = filepath.Join(mnt, "steelyard")
	t.Cleanup(func() {
		os.RemoveAll(pinDir) // the links go with their pins: the programs detach
		if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	return cgroup, pinDir
}
