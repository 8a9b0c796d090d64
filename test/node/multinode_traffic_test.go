//go:build node && multinode

package node

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// externalTrafficPolicy: Local on a LoadBalancer Service (no load
// balancer here: its node port and health check node port are what a load
// balancer would use) whose one pod runs on node 1. From outside the
// nodes: node 1's node port answers, and the pod sees the client's own
// address (no masquerade); nodes 2 and 3 drop. The health check node port
// answers 200 with localEndpoints 1 on node 1, 503 with 0 on the others.
// internalTrafficPolicy: Local on a ClusterIP Service of the same pod: the
// client pod on node 1 reaches it, the one on node 2 is dropped.
func TestMultiNodeTrafficPolicyLocal(t *testing.T) {
	n1 := node.Nodes[0]
	apply(t, pinnedPods("mn-local", []string{"mn-local-1"}, []string{n1.Name})+`---
apiVersion: v1
kind: Service
metadata: {name: mn-etp, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: mn-local}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: mn-itp, namespace: default}
spec:
  internalTrafficPolicy: Local
  selector: {app: mn-local}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	clients := clientsOnEveryNode(t)
	outside := lanClient(t)
	waitReady(t, "app=mn-local", 1, 2*time.Minute)
	waitSliceReady(t, "mn-etp", 1, time.Minute)
	waitSliceReady(t, "mn-itp", 1, time.Minute)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}
	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), "mn-etp", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodePort, hcPort := uint16(svc.Spec.Ports[0].NodePort), uint16(svc.Spec.HealthCheckNodePort)
	if nodePort == 0 || hcPort == 0 {
		t.Fatalf("Service mn-etp: node port %d, health check node port %d", nodePort, hcPort)
	}

	for k, n := range node.Nodes {
		dst := netip.AddrPortFrom(n.IP, nodePort)
		if k == 0 {
			// The source address survives: /clientip answers the
			// client's own address, on every connection.
			for i := range 20 {
				code, body, err := httpGetIn(outside.Do, dst, "/clientip", 5*time.Second)
				host, _, _ := strings.Cut(body, ":")
				if err != nil || code != 200 || host != outside.Addr.String() {
					t.Fatalf("outside client %s to %s (local endpoint), connection %d: %d %q %v, want 200 and the client's address", outside.Addr, dst, i, code, body, err)
				}
			}
			r := connections(outside.Do, dst, 200, 4)
			if r.fails != 0 || r.names["mn-local-1"] != 200 {
				t.Errorf("outside client to %s (local endpoint): %v, %d failed %v; want 200 of 200 at mn-local-1", dst, r.names, r.fails, r.errors)
			}
			t.Logf("node %s (local endpoint): node port %s: 20 of 20 saw the client's address %s, 200 of 200 new connections answered", n.Name, dst, outside.Addr)
		} else {
			// Dropped, not refused: each attempt times out.
			r := connections(outside.Do, dst, 10, 10)
			if r.ok() != 0 || r.fails != 10 {
				t.Errorf("outside client to %s (no local endpoint): %d answered %v, want all 10 dropped", dst, r.ok(), r.names)
			}
			for e := range r.errors {
				if !strings.Contains(e, "timeout") {
					t.Errorf("outside client to %s (no local endpoint): %q, want a timeout (a drop)", dst, e)
				}
			}
			t.Logf("node %s (no local endpoint): node port %s: %d of 10 dropped (%v)", n.Name, dst, r.fails, r.errors)
		}
		wantCode, wantLocal := 503, 0
		if k == 0 {
			wantCode, wantLocal = 200, 1
		}
		code, body, err := outside.HTTPGet(fmt.Sprintf("http://%s/", netip.AddrPortFrom(n.IP, hcPort)), 5*time.Second)
		var hc struct {
			Service struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
			LocalEndpoints int `json:"localEndpoints"`
		}
		jerr := json.Unmarshal([]byte(body), &hc)
		if err != nil || jerr != nil || code != wantCode || hc.LocalEndpoints != wantLocal || hc.Service.Name != "mn-etp" || hc.Service.Namespace != "default" {
			t.Errorf("node %s: health check node port %d: %d %q (%v, %v), want %d with localEndpoints %d for default/mn-etp", n.Name, hcPort, code, body, err, jerr, wantCode, wantLocal)
		} else {
			t.Logf("node %s: health check node port %d: %d %s", n.Name, hcPort, code, body)
		}
	}

	// internalTrafficPolicy: Local.
	vip := clusterIP(t, "mn-itp")
	for _, c := range clients {
		r := connections(podNS(t, c), vip, 20, 10)
		if c.Spec.NodeName == n1.Name {
			if r.fails != 0 || r.names["mn-local-1"] != 20 {
				t.Errorf("pod %s on %s (local endpoint) to %s: %v, %d failed %v; want 20 of 20 at mn-local-1", c.Name, c.Spec.NodeName, vip, r.names, r.fails, r.errors)
			}
		} else if r.ok() != 0 || r.fails != 20 {
			t.Errorf("pod %s on %s (no local endpoint) to %s: %d answered %v, want all 20 dropped", c.Name, c.Spec.NodeName, vip, r.ok(), r.names)
		}
		t.Logf("internalTrafficPolicy Local: pod %s on %s to %s: answers %v, %d failed %v", c.Name, c.Spec.NodeName, vip, r.names, r.fails, r.errors)
	}
}

// trafficDistribution PreferSameNode and PreferSameZone (each node is a
// zone of its own here: zone-a, zone-b, zone-c) over one pod per node:
// every client pod's new connections stay on its own node's pod while it
// is there; once node 1's pod is gone, node 1's client falls back to the
// pods of the other two nodes, and the other clients stay on their own.
func TestMultiNodeTrafficDistribution(t *testing.T) {
	var names, nodes []string
	ownPod, zone := map[string]string{}, map[string]string{}
	for k, n := range node.Nodes {
		names, nodes = append(names, fmt.Sprintf("mn-td-%d", k+1)), append(nodes, n.Name)
		ownPod[n.Name], zone[n.Name] = names[k], n.Zone
	}
	docs := []string{pinnedPods("mn-td", names, nodes)}
	for _, td := range []string{"PreferSameNode", "PreferSameZone"} {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: mn-td-%s, namespace: default}
spec:
  trafficDistribution: %s
  selector: {app: mn-td}
  ports: [{name: http, port: 80, targetPort: 8080}]
`, strings.ToLower(strings.TrimPrefix(td, "PreferSame")), td))
	}
	apply(t, strings.Join(docs, "---\n"))
	clients := clientsOnEveryNode(t)
	waitReady(t, "app=mn-td", 3, 2*time.Minute)
	svcs := []string{"mn-td-node", "mn-td-zone"}
	check := func(phase string, gone map[string]bool) {
		t.Helper()
		for _, s := range svcs {
			waitSliceReady(t, s, 3-len(gone), time.Minute)
		}
		for _, n := range node.Nodes {
			waitVerifyOn(t, n.Name, 30*time.Second)
		}
		for _, s := range svcs {
			vip := clusterIP(t, s)
			for _, c := range clients {
				own := ownPod[c.Spec.NodeName]
				r := connections(podNS(t, c), vip, 200, 4)
				if r.fails != 0 {
					t.Errorf("%s: %s from pod %s on %s: %d of 200 failed: %v", phase, s, c.Name, c.Spec.NodeName, r.fails, r.errors)
				}
				if !gone[own] {
					if r.names[own] != r.ok() {
						t.Errorf("%s: %s from pod %s on %s: answers %v, want all at %s (same node, same zone)", phase, s, c.Name, c.Spec.NodeName, r.names, own)
					}
				} else {
					// Fallback to the whole cluster: every pod that is
					// left answers (200 at 1/2 each: a miss is 2^-200).
					for _, other := range names {
						if (r.names[other] == 0) != gone[other] {
							t.Errorf("%s: %s from pod %s on %s: answers %v, want all of the remaining pods and none of the gone", phase, s, c.Name, c.Spec.NodeName, r.names)
							break
						}
					}
				}
				t.Logf("%s: %s (%s) from pod %s on %s (%s): %v, %d failed", phase, s, vip, c.Name, c.Spec.NodeName, zone[c.Spec.NodeName], r.names, r.fails)
			}
		}
	}
	check("every node has its pod", nil)
	kubectl(t, "delete", "pod", names[0], "--wait=true", "--timeout=90s")
	check(names[0]+" deleted", map[string]bool{names[0]: true})
}
