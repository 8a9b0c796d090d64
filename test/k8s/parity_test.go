//go:build k8s

package k8s

// The cluster source of the kube-proxy parity fields, against a real API
// server: the node port and health check node port it allocates, the
// load-balancer status, the traffic policy, affinity, and the Node's zone
// and primary address.
//
// IP plan: clusterIPs 198.18.0.90, .91; load-balancer IP 198.18.2.90;
// pods 198.19.9.2 .. .5; the Node's InternalIP is the node's client-LAN
// address 198.19.254.1.

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

func TestParityFromTheAPIServer(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	// This node, with its zone and primary address.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
	node, err := e.admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: sandbox.NodeLANIP.String()}}
	if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	local, remote := backend{"p-1", "198.19.9.2"}, backend{"p-2", "198.19.9.3"}
	near, far := backend{"t-1", "198.19.9.4"}, backend{"t-2", "198.19.9.5"}
	e.addPods(local, remote, near, far)

	lb := newService("par-lb", "198.18.0.90", map[string]string{weightsKey: "p-1=1,p-2=3"}, nil)
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	lb.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	sl := newSlice("par-lb", nil, local, remote)
	sl.Endpoints[0].NodeName, sl.Endpoints[1].NodeName = ptr.To(nodeName), ptr.To("node2")
	e.create(lb, sl)
	lb, err = e.admin.CoreV1().Services(testNS).Get(ctx, "par-lb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.2.90"}}
	if lb, err = e.admin.CoreV1().Services(testNS).UpdateStatus(ctx, lb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodePort, hcPort := lb.Spec.Ports[0].NodePort, lb.Spec.HealthCheckNodePort
	t.Logf("the API server allocated node port %d and health check node port %d", nodePort, hcPort)

	topo := newService("par-topo", "198.18.0.91", nil, nil)
	tsl := newSlice("par-topo", nil, near, far)
	tsl.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	tsl.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	e.create(topo, tsl)

	e.startAgent(e.cp.Kubeconfig)
	e.waitVerify(15*time.Second, "--node-name", nodeName)

	views := map[string]dataplane.ServiceView{}
	for _, v := range e.explain() {
		views[v.Key()] = v
		t.Logf("explain: %s", v.Line())
	}
	np := views["0.0.0.0:"+strconv.Itoa(int(nodePort))+"/TCP"]
	if np.Policy != dataplane.PolicyLocal || np.AffinitySeconds != 60 || strings.Join(np.NodeAddresses, ",") != sandbox.NodeLANIP.String() ||
		len(np.Backends) != 1 || np.Backends[0].IP != local.ip {
		t.Errorf("node port view %+v: want Local policy, affinity 60 s, on the Node's InternalIP, only %s", np, local.ip)
	}
	if v := views["198.18.2.90:80/TCP"]; v.Entry != dataplane.EntryLoadBalancer || len(v.Backends) != 1 {
		t.Errorf("load-balancer view %+v", v)
	}
	if v := views["198.18.0.90:80/TCP"]; len(v.Backends) != 2 {
		t.Errorf("the clusterIP keeps both endpoints: %+v", v)
	}
	if v := views["198.18.0.91:80/TCP"]; len(v.Backends) != 1 || v.Backends[0].IP != near.ip {
		t.Errorf("topology: %+v, want only %s (hinted for zone-a)", v, near.ip)
	}

	r, err := e.client.TCPConns(netip.AddrPortFrom(sandbox.NodeLANIP, uint16(nodePort)), 200, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node port: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{local.pod: 100}, 0)
	code, body, err := e.client.HTTPGet("http://"+sandbox.NodeLANIP.String()+":"+strconv.Itoa(int(hcPort))+"/", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("health check node port: %d %s", code, strings.TrimSpace(body))
	if code != 200 || !strings.Contains(body, `"localEndpoints":1`) {
		t.Errorf("health check node port: %d %s, want 200 with 1 local endpoint", code, body)
	}
}
