//go:build node && multinode

package node

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// kubectl drain of node 1 under load: a Deployment of three pods spread
// over the nodes, new connections from the client pod of every node to
// its VIP and from outside to the node port of every node (node 1's too,
// which keeps forwarding while cordoned). The drain evicts the
// Deployment's pod on node 1 (--pod-selector: the suite's client pods
// stay), the Deployment replaces it on another node, and not one new
// connection fails.
func TestMultiNodeDrain(t *testing.T) {
	drained := node.Nodes[0].Name
	apply(t, spreadDeployment("mn-drain", 3))
	t.Cleanup(func() { _, _ = node.Kubectl(context.Background(), "uncordon", drained) })
	pods := waitReady(t, "app=mn-drain", 3, 2*time.Minute)
	waitSliceReady(t, "mn-drain", 3, time.Minute)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	on := map[string]string{}
	for _, p := range pods {
		on[p.Name] = p.Spec.NodeName
	}
	t.Logf("before the drain: %v", on)
	sources := serviceLoadSources(t, clusterIP(t, "mn-drain"), nodePortOf(t, "mn-drain"))
	t0 := time.Now()
	stop := load(t, sources)
	time.Sleep(5 * time.Second)
	out, err := node.Kubectl(t.Context(), "drain", drained, "--ignore-daemonsets", "--pod-selector=app=mn-drain", "--timeout=3m")
	if err != nil {
		stop()
		t.Fatalf("kubectl drain %s: %v\n%s", drained, err, out)
	}
	t.Logf("kubectl drain %s after %v: %s", drained, time.Since(t0).Round(time.Second), strings.TrimSpace(out))
	pods = waitReady(t, "app=mn-drain", 3, 2*time.Minute)
	waitSliceReady(t, "mn-drain", 3, time.Minute)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	time.Sleep(5 * time.Second)
	tallies := stop()
	took := time.Since(t0)
	on = map[string]string{}
	for _, p := range pods {
		on[p.Name] = p.Spec.NodeName
		if p.Spec.NodeName == drained {
			t.Errorf("pod %s still on the drained node %s", p.Name, drained)
		}
	}
	t.Logf("after the drain: %v", on)
	total := noFailures(t, "drain of "+drained, sources, tallies)
	t.Logf("drain of %s under load: %d new connections in %v", drained, total, took.Round(time.Second))
}

// A rolling update of the DaemonSet (a new flag, --min-sync-period=200ms,
// rolls one node at a time: maxUnavailable 1) under the load of
// TestMultiNodeDrain's sources on a Deployment of three pods. Not one new
// connection fails, and connections established before the update (one
// keep-alive connection from each source) carry a request every second
// through it and after it, to the same pod.
func TestMultiNodeDaemonSetRollingUpdate(t *testing.T) {
	apply(t, spreadDeployment("mn-roll", 3))
	waitReady(t, "app=mn-roll", 3, 2*time.Minute)
	waitSliceReady(t, "mn-roll", 3, time.Minute)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	sources := serviceLoadSources(t, clusterIP(t, "mn-roll"), nodePortOf(t, "mn-roll"))
	old := map[string]types.UID{}
	for _, n := range node.Nodes {
		old[n.Name] = steelyardPodOn(t, n.Name).UID
	}

	// The established connections, and their first answer.
	type held struct {
		who      string
		c        net.Conn
		pod      string
		requests int
	}
	var conns []*held
	for _, s := range sources {
		c, err := dialIn(s.ns, s.dst, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", s.who, err)
		}
		t.Cleanup(func() { c.Close() })
		h := &held{who: s.who + " to " + s.dst.String(), c: c}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if h.pod, err = getHostname(c, "keep-alive"); err != nil {
			t.Fatalf("%s: first request: %v", h.who, err)
		}
		conns = append(conns, h)
	}
	ask := func(phase string) {
		t.Helper()
		for _, h := range conns {
			_ = h.c.SetDeadline(time.Now().Add(5 * time.Second))
			got, err := getHostname(h.c, "keep-alive")
			h.requests++
			if err != nil || got != h.pod {
				t.Fatalf("%s: established connection of %s, request %d: %q %v, want %s", phase, h.who, h.requests, got, err, h.pod)
			}
		}
	}

	t0 := time.Now()
	stop := load(t, sources)
	rolled := make(chan error, 1)
	go func() {
		args := cluster.AddAgentArgs("--min-sync-period=200ms")
		if _, err := node.Kubectl(context.Background(), args...); err != nil {
			rolled <- err
			return
		}
		_, err := node.Kubectl(context.Background(), "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=6m")
		rolled <- err
	}()
	var rollErr error
	for done := false; !done; {
		select {
		case rollErr = <-rolled:
			done = true
		case <-time.After(time.Second):
			ask("during the rolling update")
		}
	}
	if rollErr != nil {
		stop()
		t.Fatalf("rolling update: %v", rollErr)
	}
	rollTook := time.Since(t0)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	for range 5 {
		time.Sleep(time.Second)
		ask("after the rolling update")
	}
	tallies := stop()
	for _, n := range node.Nodes {
		p := steelyardPodOn(t, n.Name)
		if p.UID == old[n.Name] || !slices.Contains(p.Spec.Containers[0].Args, "--min-sync-period=200ms") {
			t.Errorf("node %s: steelyard pod %s not replaced by one with the new flag (args %q)", n.Name, p.Name, p.Spec.Containers[0].Args)
		}
	}
	total := noFailures(t, "DaemonSet rolling update", sources, tallies)
	for _, h := range conns {
		t.Logf("established connection of %s: %d requests through the update, all answered by %s", h.who, h.requests, h.pod)
	}
	t.Logf("DaemonSet rolling update over %d nodes in %v under load: %d new connections, %d established connections kept", len(node.Nodes), rollTook.Round(time.Second), total, len(conns))
}

// nodePortOf returns a Service's first node port.
func nodePortOf(t *testing.T, name string) uint16 {
	t.Helper()
	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return uint16(svc.Spec.Ports[0].NodePort)
}
