//go:build ipvsvm

package ipvs

// Dual-stack in IPVS mode, with real traffic in the VM: one Service with an
// IPv4 and an IPv6 clusterIP and a node port, 10/90 by weight in both
// families. IPv6 addresses come from the benchmarking range 2001:2::/48
// only (test/sandbox's IPv6 plan):
//
//	clusterIPs   198.18.0.36 and 2001:2::50, node port 30087
//	node         2001:2:0:fe::1 (node0), 2001:2:0:fd::1 (client LAN)
//	pods         np-1 2001:2:0:1::2, np-2 2001:2:0:1::3 (also 198.19.20.2/.3)
//	client       2001:2:0:fd::2

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

const ipv6Manifest = `apiVersion: v1
kind: Service
metadata: {namespace: parity, name: v6, annotations: {steelyard.io/weights: "np-1=10,np-2=90"}}
spec:
  type: NodePort
  clusterIP: 198.18.0.36
  clusterIPs: [198.18.0.36, "2001:2::50"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: tcp, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30087}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: parity, name: v6-x4, labels: {kubernetes.io/service-name: v6}}
addressType: IPv4
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints:
  - {addresses: ["198.19.20.2"], conditions: {ready: true}, nodeName: ipvs-node, targetRef: {kind: Pod, namespace: parity, name: np-1}}
  - {addresses: ["198.19.20.3"], conditions: {ready: true}, nodeName: other-node, targetRef: {kind: Pod, namespace: parity, name: np-2}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: parity, name: v6-x6, labels: {kubernetes.io/service-name: v6}}
addressType: IPv6
ports: [{name: tcp, protocol: TCP, port: 8080}]
endpoints:
  - {addresses: ["2001:2:0:1::2"], conditions: {ready: true}, nodeName: ipvs-node, targetRef: {kind: Pod, namespace: parity, name: np-1}}
  - {addresses: ["2001:2:0:1::3"], conditions: {ready: true}, nodeName: other-node, targetRef: {kind: Pod, namespace: parity, name: np-2}}
`

// setupIPv6 gives the node, the client and the np pods their IPv6
// addresses (the pods' ServeSource servers listen on both families) and
// writes the dual-stack Service. Call it before the agent starts.
func (f *fixture) setupIPv6() {
	f.t.Helper()
	if err := f.sb.EnableIPv6(); err != nil {
		f.t.Fatal(err)
	}
	if err := f.sb.AddClient6(f.client, netip.MustParseAddr("2001:2:0:fd::2")); err != nil {
		f.t.Fatal(err)
	}
	for name, ip := range map[string]string{"np-1": "2001:2:0:1::2", "np-2": "2001:2:0:1::3"} {
		if err := f.sb.AddPod6(f.sb.Pod(name), netip.MustParseAddr(ip)); err != nil {
			f.t.Fatal(err)
		}
	}
	f.write("v6.yaml", ipv6Manifest)
}

func (f *fixture) ipv6(t *testing.T) {
	out, err := f.steelyard("explain", "--mode", "ipvs")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "parity/v6:") {
			lines = append(lines, l)
		}
	}
	t.Logf("steelyard explain --mode ipvs (dual-stack Service):\n%s", strings.Join(lines, "\n"))
	for _, want := range []string{
		"198.18.0.36:80/TCP  198.19.20.2:8080 10.00%  198.19.20.3:8080 90.00%  parity/v6:tcp",
		"[2001:2::50]:80/TCP  [2001:2:0:1::2]:8080 10.00%  [2001:2:0:1::3]:8080 90.00%  parity/v6:tcp\n",
		"[::]:30087/TCP  [2001:2:0:1::2]:8080 10.00%  [2001:2:0:1::3]:8080 90.00%  parity/v6:tcp  [nodePort, on 2001:2:0:fd::1,2001:2:0:fe::1, policy Cluster]",
		"0.0.0.0:30087/TCP  198.19.20.2:8080 10.00%  198.19.20.3:8080 90.00%  parity/v6:tcp  [nodePort, on 198.19.0.1,198.19.254.1, policy Cluster]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q", want)
		}
	}
	table, adm := f.ipvsadm()
	var admLines []string
	for _, l := range strings.Split(adm, "\n") {
		if strings.Contains(l, "2001:2") {
			admLines = append(admLines, l)
		}
	}
	t.Logf("ipvsadm -Ln (IPv6):\n%s", strings.Join(admLines, "\n"))
	for _, vs := range []string{"TCP [2001:2::50]:80", "TCP [2001:2:0:fd::1]:30087", "TCP [2001:2:0:fe::1]:30087"} {
		ds := table[vs]
		a, b := ds["[2001:2:0:1::2]:8080"].Weight, ds["[2001:2:0:1::3]:8080"].Weight
		if len(ds) != 2 || a+b == 0 || math.Abs(100*float64(a)/float64(a+b)-10) > 0.01 {
			t.Errorf("%s: destinations %v, want weights 10:90", vs, ds)
		}
	}

	// One connection first: if IPv6 does not pass, say why at once rather
	// than after hundreds of timeouts.
	for _, dst := range []string{"[2001:2::50]:80", "[2001:2:0:fd::1]:30087"} {
		if _, err := f.client.FirstLine(netip.Addr{}, ap(dst), 3*time.Second); err != nil {
			var dump strings.Builder
			for _, cmd := range [][]string{{"ip", "-6", "addr"}, {"ip", "-6", "route"}, {"ip6tables-save", "-c"},
				{"ipvsadm", "-Lnc"}, {"cat", "/proc/sys/net/ipv6/conf/all/forwarding"}, {"cat", "/proc/net/nf_conntrack"}} {
				o, err := f.sb.Node.Exec(cmd...)
				fmt.Fprintf(&dump, "$ %s (%v)\n%s\n", strings.Join(cmd, " "), err, o)
			}
			t.Fatalf("%s: %v\n%s", dst, err, dump.String())
		}
	}
	load := sandbox.Load{Concurrency: 16, Timeout: 5 * time.Second}
	start := time.Now()
	// wrr is exact: 500 connections at 10/90 land 50/450 (the IPv4
	// tests above already show it on 1,000; the VM's time is bounded).
	r, err := f.client.TCPConnsAny(ap("[2001:2::50]:80"), 500, load)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("IPv6 clusterIP [2001:2::50]:80, 10/90: %s", r)
	expectExact(t, r, map[string]int{"np-1": 50, "np-2": 450}, 5)
	r, err = f.client.TCPConnsAny(ap("[2001:2:0:fd::1]:30087"), 200, load)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("IPv6 node port [2001:2:0:fd::1]:30087, 10/90: %s", r)
	expectExact(t, r, map[string]int{"np-1": 20, "np-2": 180}, 2)
	// Cluster policy on the node port: masqueraded, the pod sees a node
	// address, not the client's.
	if _, client := seenBy(t, f.client, ap("[2001:2:0:fd::1]:30087")); client == "2001:2:0:fd::2" {
		t.Errorf("IPv6 node port, cluster policy: the pod saw the client's own address %s", client)
	}
	t.Logf("700 IPv6 connections in %s", time.Since(start).Round(time.Millisecond))
}
