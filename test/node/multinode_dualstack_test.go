//go:build node && multinode

package node

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/node/cluster"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The dual-stack cluster (issue 20 item 1): every pod has an address of
// each family from its node's two pod ranges; a RequireDualStack Service
// weighted 10/90 (steelyard.io/weights), whose pods run on nodes 1 and 2,
// splits new connections 10/90 in both families from a client pod on each
// node (at either ClusterIP) and from outside the nodes through the
// NodePort of node 3, which runs none of them (at either InternalIP).
func TestMultiNodeDualStack(t *testing.T) {
	if !node.DualStack() || len(node.Nodes) < 3 {
		t.Fatalf("want a dual-stack cluster of 3 nodes: dual-stack %t, %d nodes", node.DualStack(), len(node.Nodes))
	}
	apply(t, pinnedPods("mn-ds", []string{"mn-ds-1", "mn-ds-2"}, []string{node.Nodes[0].Name, node.Nodes[1].Name})+`---
apiVersion: v1
kind: Service
metadata:
  name: mn-ds
  namespace: default
  annotations: {steelyard.io/weights: "mn-ds-1=10,mn-ds-2=90"}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {app: mn-ds}
  ports: [{name: http, port: 80, targetPort: 8080}]
`)
	clients := clientsOnEveryNode(t)
	waitReady(t, "app=mn-ds", 2, 2*time.Minute)
	// One EndpointSlice per family, two endpoints each.
	waitSliceReady(t, "mn-ds", 4, time.Minute)
	wantPodAddresses(t)

	// Pod to pod across nodes at the IPv6 pod IP (the routes between the
	// nodes' /64s), no Service.
	for _, from := range clients {
		for _, to := range clients {
			if from.Spec.NodeName == to.Spec.NodeName {
				continue
			}
			ip := netip.MustParseAddr(to.Status.PodIPs[len(to.Status.PodIPs)-1].IP)
			if !ip.Is6() {
				t.Errorf("pod %s: no IPv6 address in %v", to.Name, to.Status.PodIPs)
				continue
			}
			dst := netip.AddrPortFrom(ip, 8080)
			r := connections(podNS(t, from), dst, 5, 1)
			if r.fails != 0 || r.names[to.Name] != 5 {
				t.Errorf("pod %s (%s) to pod %s at %s (%s): answers %v, errors %v", from.Name, from.Spec.NodeName, to.Name, dst, to.Spec.NodeName, r.names, r.errors)
			}
		}
	}

	svc, err := node.Client().CoreV1().Services("default").Get(t.Context(), "mn-ds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var vips []netip.Addr
	for _, s := range svc.Spec.ClusterIPs {
		vips = append(vips, netip.MustParseAddr(s))
	}
	if len(vips) != 2 || !vips[0].Is4() || !vips[1].Is6() || !cluster.ServiceCIDR6.Contains(vips[1]) {
		t.Fatalf("Service mn-ds: clusterIPs %v, want an IPv4 one and an IPv6 one in %s", svc.Spec.ClusterIPs, cluster.ServiceCIDR6)
	}
	nodePort := uint16(svc.Spec.Ports[0].NodePort)
	for _, n := range node.Nodes {
		waitVerifyOn(t, n.Name, 30*time.Second)
	}

	// Per source and family: 3,000 new connections; at 10 % the share's
	// sigma is 0.55 points, and 4.5 sigma (sandbox.ShareTolerance) gives
	// +-2.5 points. Sixteen runs at once, 4 connections at a time each.
	const n, conc = 3000, 4
	empty := node.Nodes[2]
	outside := lanClient(t)
	type source struct {
		who string
		ns  inNS
		dst netip.AddrPort
	}
	var sources []source
	for _, vip := range vips {
		for _, c := range clients {
			sources = append(sources, source{fmt.Sprintf("pod %s on %s", c.Name, c.Spec.NodeName), podNS(t, c), netip.AddrPortFrom(vip, 80)})
		}
	}
	for _, ip := range []netip.Addr{empty.IP, empty.IP6} {
		sources = append(sources, source{fmt.Sprintf("outside client %s/%s via NodePort of %s", outside.Addr, node.LANClientIP6(outside), empty.Name), outside.Do, netip.AddrPortFrom(ip, nodePort)})
	}
	tallies := make([]*tally, len(sources))
	took := make([]time.Duration, len(sources))
	var wg sync.WaitGroup
	for i, s := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			tallies[i] = connections(s.ns, s.dst, n, conc)
			took[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	want := map[string]float64{"mn-ds-1": 10, "mn-ds-2": 90}
	for i, s := range sources {
		r := tallies[i]
		t.Logf("%s: %d connections to %s in %v: %v, %d failed", s.who, n, s.dst, took[i].Round(time.Millisecond), r.names, r.fails)
		if r.fails != 0 {
			t.Errorf("%s to %s: %d of %d connections failed: %v", s.who, s.dst, r.fails, n, r.errors)
		}
		if r.ok() == 0 {
			t.Errorf("%s to %s: no answers", s.who, s.dst)
			continue
		}
		for name, w := range want {
			tol := sandbox.ShareTolerance(w, r.ok(), 4.5)
			if got := r.share(name); math.Abs(got-w) > tol {
				t.Errorf("%s to %s: %s %.2f%%, want %.0f%% +- %.2f", s.who, s.dst, name, got, w, tol)
			}
		}
		for name := range r.names {
			if _, ok := want[name]; !ok {
				t.Errorf("%s to %s: answered by %q, not a backend", s.who, s.dst, name)
			}
		}
	}
}

// wantPodAddresses checks that every running pod that is not on the
// node's network has two addresses, IPv4 first, inside its node's pod
// ranges.
func wantPodAddresses(t *testing.T) {
	t.Helper()
	pods, err := node.Client().CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range pods.Items {
		if p.Spec.HostNetwork || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		n := node.Node(p.Spec.NodeName)
		if n == nil {
			t.Errorf("pod %s/%s on unknown node %q", p.Namespace, p.Name, p.Spec.NodeName)
			continue
		}
		var ips []string
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		ok := len(ips) == 2
		if ok {
			a, err4 := netip.ParseAddr(ips[0])
			b, err6 := netip.ParseAddr(ips[1])
			ok = err4 == nil && err6 == nil && n.PodCIDR.Contains(a) && n.PodCIDR6.Contains(b)
		}
		if !ok {
			t.Errorf("pod %s/%s on %s: podIPs %s, want one in %s and one in %s", p.Namespace, p.Name, n.Name, strings.Join(ips, ","), n.PodCIDR, n.PodCIDR6)
			continue
		}
		checked++
	}
	if checked == 0 {
		t.Error("no running pod to check")
	}
	t.Logf("%d running pods, each with an IPv4 and an IPv6 address of its node's ranges", checked)
}
