//go:build node

package node

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// steelyard-cni's DEL on a real pod: a two-way UDP flow from the node to a
// pod (no Service, so the agent has no reason to touch it) leaves conntrack
// entries for the pod's IP; when kubelet deletes the pod, the runtime runs
// the chain's DEL and the entries are gone long before the kernel would
// expire them. Nothing else in the chain deletes them: the reference
// bridge plugin has no conntrack code and portmap's DEL returns early for a
// pod without hostPorts (plugins v1.10.0). (Hairpin on pods created after
// install: TestHairpin.)
func TestConntrackCleanupOnPodDelete(t *testing.T) {
	apply(t, `apiVersion: v1
kind: Pod
metadata: {name: udp-target, namespace: default, labels: {app: udp-target}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: netexec
    image: `+cluster.AgnhostImage+`
    imagePullPolicy: IfNotPresent
    args: ["netexec", "--http-port=8080", "--udp-port=8081"]
    readinessProbe:
      httpGet: {path: /hostname, port: 8080}
      periodSeconds: 1
`)
	p := waitReady(t, "app=udp-target", 1, 2*time.Minute)[0]
	ip := p.Status.PodIP
	// Request and answer 20 times: the entry has seen both directions.
	var answer string
	err := node.Sandbox.Node.Do(func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(ip, "8081"))
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for range 20 {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("hostname")); err != nil {
				return err
			}
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			answer = strings.TrimSpace(string(buf[:n]))
		}
		return nil
	})
	lastPacket := time.Now()
	if err != nil || answer != "udp-target" {
		t.Fatalf("UDP to %s:8081 from the node: %q, %v", ip, answer, err)
	}
	before := flowsTo(t, ip)
	if before == 0 {
		t.Fatalf("no conntrack entry for %s after a two-way UDP flow", ip)
	}
	// The kernel alone would keep them this long (per network namespace).
	timeout := 30
	if v, err := node.Sandbox.Node.ReadSysctl("net.netfilter.nf_conntrack_udp_timeout"); err == nil {
		timeout, _ = strconv.Atoi(strings.TrimSpace(v))
	}
	kubectl(t, "delete", "pod", "udp-target", "--wait=true", "--timeout=60s")
	deleted := time.Now()
	deadline := lastPacket.Add(time.Duration(timeout) * time.Second)
	for flowsTo(t, ip) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("conntrack entries for %s still there %v after the last packet (the kernel's UDP timeout is %d s); steelyard-cni's DEL did not delete them",
				ip, time.Since(lastPacket).Round(time.Millisecond), timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("pod %s: %d conntrack entries before delete; none %v after `kubectl delete` returned, %v after the last packet (kernel UDP timeout %d s)",
		ip, before, time.Since(deleted).Round(time.Millisecond), time.Since(lastPacket).Round(time.Millisecond), timeout)
}

// flowsTo counts the node namespace's conntrack entries whose original
// destination is ip.
func flowsTo(t *testing.T, ip string) int {
	t.Helper()
	out, _, err := node.Sandbox.Node.Exec2("conntrack", "-L", "-d", ip)
	if err != nil {
		t.Fatalf("conntrack -L -d %s: %v", ip, err)
	}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "dst="+ip+" ") {
			n++
		}
	}
	return n
}
