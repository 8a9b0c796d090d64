//go:build e2e

package e2e

// kube-proxy parity against the real kernel: node ports, external and
// load-balancer IPs with source ranges, traffic policies with the health
// check node port, session affinity, topology and IPv6.
//
// IP plan (benchmarking ranges only; see test/sandbox):
//
//	Services     198.18.0.20 .. 198.18.0.50 and 2001:2::50
//	external IP  198.18.1.10; load-balancer IPs 198.18.2.10, 198.18.2.20, 198.18.2.21
//	node         198.19.0.1 (node0), 198.19.254.1 (client LAN); 2001:2:0:fd::1
//	pods         198.19.20.x .. 198.19.26.x; 2001:2:0:1::x
//	clients      198.19.254.2 (+ 198.19.254.20.. as extra addresses),
//	             198.19.254.200 (outside the source ranges); 2001:2:0:fd::2
//
// Pods that must be "on another node" are declared so in their EndpointSlice
// (nodeName); they still run in this sandbox, as a remote pod would be
// reachable through the pod network.

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// thisNode is the node name the agent and verify use by default ($NODE_NAME,
// else the hostname): endpoints with it are local.
func thisNode(t *testing.T) string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pEndpoint is an endpoint of a parity Service.
type pEndpoint struct {
	name, ip string
	node     string   // "" : this node
	zone     string   // topology zone
	hints    []string // forZones
	// terminating: serving and terminating (a pod in its grace period),
	// not ready.
	terminating bool
}

// pService is a parity Service: svc's fields plus the entry points and
// policies, tweaked on the generated object.
type pService struct {
	name       string
	clusterIPs []string
	port       int32
	targetPort int32
	weights    string
	endpoints  []pEndpoint
	// v6 endpoints, for a dual-stack Service
	endpoints6 []pEndpoint
	tweak      func(*corev1.Service)
}

func (s pService) objects(t *testing.T) []any {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: s.name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  s.clusterIPs[0],
			ClusterIPs: s.clusterIPs,
			Ports:      []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: s.port, TargetPort: intstr.FromInt32(s.targetPort)}},
		},
	}
	if s.weights != "" {
		svc.Annotations = map[string]string{"steelyard.io/weights": s.weights}
	}
	if s.tweak != nil {
		s.tweak(svc)
	}
	objs := []any{svc}
	for i, eps := range [][]pEndpoint{s.endpoints, s.endpoints6} {
		if len(eps) == 0 {
			continue
		}
		portName, proto, ready := "tcp", corev1.ProtocolTCP, true
		sl := &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Namespace: testNamespace, Name: s.name + []string{"-v4", "-v6"}[i],
				Labels: map[string]string{discoveryv1.LabelServiceName: s.name},
			},
			AddressType: []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}[i],
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &s.targetPort}},
		}
		for _, e := range eps {
			node := e.node
			if node == "" {
				node = thisNode(t)
			}
			ep := discoveryv1.Endpoint{
				Addresses:  []string{e.ip},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: testNamespace, Name: e.name},
				NodeName:   &node,
			}
			if e.terminating {
				yes, no := true, false
				ep.Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
			}
			if e.zone != "" {
				ep.Zone = &e.zone
			}
			if len(e.hints) > 0 {
				ep.Hints = &discoveryv1.EndpointHints{}
				for _, z := range e.hints {
					ep.Hints.ForZones = append(ep.Hints.ForZones, discoveryv1.ForZone{Name: z})
				}
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		objs = append(objs, sl)
	}
	return objs
}

// writeParity writes the objects of services to file in the manifest directory.
func (f *fixture) writeParity(file string, services ...pService) {
	f.t.Helper()
	var b strings.Builder
	for _, s := range services {
		for _, o := range s.objects(f.t) {
			y, err := yaml.Marshal(o)
			if err != nil {
				f.t.Fatal(err)
			}
			b.WriteString("---\n")
			b.Write(y)
		}
	}
	if err := os.WriteFile(f.dir+"/"+file, []byte(b.String()), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// addSourcePods starts, for every endpoint, a pod answering "<name> <client
// address>" on the target port.
func (f *fixture) addSourcePods(services ...pService) {
	f.t.Helper()
	for _, s := range services {
		for _, e := range s.endpoints {
			if f.sb.Pod(e.name) != nil {
				continue
			}
			p, err := f.sb.AddPod(e.name, netip.MustParseAddr(e.ip))
			if err != nil {
				f.t.Fatal(err)
			}
			if err := p.ServeSource(uint16(s.targetPort)); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

// conns runs count TCP connections from ns to dst and checks the shares.
func conns(t *testing.T, ns *sandbox.NS, what string, dst netip.AddrPort, count int, want map[string]float64, tol float64) {
	t.Helper()
	sb := sandbox.Of(ns)
	var before sandbox.Snapshot
	if sb != nil {
		before = sb.Counters()
	}
	lag := sandbox.WatchLag(10 * time.Millisecond)
	r, err := ns.TCPConnsAny(dst, count, sandbox.Load{})
	maxLag := lag.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (%s): %s", what, dst, r)
	if r.Failed() > 0 {
		// A stall of the whole machine (a VM starved of CPU under TCG)
		// shows as a late wake-up and failures at one moment.
		t.Logf("  failures at %v after the start; a 10 ms sleep woke at most %v late during the run", r.FailedAt, maxLag.Round(time.Millisecond))
		if sb != nil && len(r.FailedAt) > 0 {
			// What the agent did from 3 s before the first failure to the last.
			from := time.Now().Add(-r.Elapsed + r.FailedAt[0] - 3*time.Second)
			to := time.Now().Add(-r.Elapsed + r.FailedAt[len(r.FailedAt)-1])
			for _, a := range sb.Agents() {
				for _, l := range sandbox.LogLinesBetween(a.Log(), from, to, 40) {
					t.Logf("  agent %d: %s", a.Pid(), l)
				}
			}
		}
	}
	if (r.Failed() > 0 || os.Getenv("STEELYARD_COUNTERS") != "") && sb != nil {
		// Where the lost connections went: the counters of drops,
		// retransmissions and conntrack failures that grew meanwhile
		// (STEELYARD_COUNTERS: after every run, to compare modes).
		for _, l := range sb.Counters().Grown(before) {
			t.Logf("  grown during the run: %s", l)
		}
	}
	sandbox.ExpectShares(t, r, want, tol)
}

// dropped checks that a new connection gets no answer at all (dropped,
// not refused).
func dropped(t *testing.T, ns *sandbox.NS, what string, dst netip.AddrPort) {
	t.Helper()
	_, err := ns.FirstLine(netip.Addr{}, dst, time.Second)
	switch {
	case err == nil:
		t.Errorf("%s: %s answered, want dropped", what, dst)
	case errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("%s: %s refused, want dropped (no answer)", what, dst)
	default:
		t.Logf("%s: %s dropped (%v)", what, dst, err)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func findView(t *testing.T, views []dataplane.ServiceView, key string) dataplane.ServiceView {
	t.Helper()
	for _, v := range views {
		if v.Key() == key {
			return v
		}
	}
	t.Fatalf("explain has no %s", key)
	return dataplane.ServiceView{}
}

func caseNodePort(t *testing.T, m dpMode) {
	web := pService{
		name: "np", clusterIPs: []string{"198.18.0.20"}, port: 80, targetPort: 8080, weights: "np-1=10,np-2=90",
		endpoints: []pEndpoint{{name: "np-1", ip: "198.19.20.2"}, {name: "np-2", ip: "198.19.20.3", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(web)
	f.writeParity("np.yaml", web)
	f.start()

	v := findView(t, f.explain(), "0.0.0.0:30080/TCP")
	t.Logf("explain: %s", v.Line())
	if got := viewcheck.Shares(&v); !viewcheck.Same(got, map[string]float64{"198.19.20.2": 10, "198.19.20.3": 90}) || v.Entry != dataplane.EntryNodePort {
		t.Errorf("explain node port: %+v", v)
	}
	// 5,000 at 10/90: sigma(10%) = 0.42 points; 2 points = 4.7 sigma.
	conns(t, f.client, "node port from a client", ap("198.19.254.1:30080"), 5000, map[string]float64{"np-1": 10, "np-2": 90}, 2)
	// 2,000: sigma 0.67 points; 3 points = 4.5 sigma.
	conns(t, f.client, "node port on the node's other address", ap("198.19.0.1:30080"), 2000, map[string]float64{"np-1": 10, "np-2": 90}, 3)
	conns(t, f.sb.Node, "node port from the node itself", ap("198.19.254.1:30080"), 2000, map[string]float64{"np-1": 10, "np-2": 90}, 3)
	conns(t, f.sb.Pod("np-1").NS, "node port from a pod", ap("198.19.0.1:30080"), 2000, map[string]float64{"np-1": 10, "np-2": 90}, 3)
	// Cluster policy masquerades, as kube-proxy does: the pod does not see
	// the client's address.
	line, err := f.client.FirstLine(netip.Addr{}, ap("198.19.254.1:30080"), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(line, " 198.19.254.2") {
		t.Errorf("cluster policy: the pod saw the client's own address (%q), want the node's", line)
	}
}

func caseExternalIPsAndLoadBalancerSourceRanges(t *testing.T, m dpMode) {
	lb := pService{
		name: "lb", clusterIPs: []string{"198.18.0.21"}, port: 80, targetPort: 8080, weights: "lb-1=10,lb-2=90",
		endpoints: []pEndpoint{{name: "lb-1", ip: "198.19.21.2"}, {name: "lb-2", ip: "198.19.21.3"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30081
			s.Spec.ExternalIPs = []string{"198.18.1.10"}
			s.Spec.LoadBalancerSourceRanges = []string{"198.19.254.0/25"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.2.10"}}
		},
	}
	f := newFixture(t, m)
	outsider, err := f.sb.AddClient(netip.MustParseAddr("198.19.254.200"))
	if err != nil {
		t.Fatal(err)
	}
	f.addSourcePods(lb)
	f.writeParity("lb.yaml", lb)
	f.start()
	views := f.explain()
	for _, key := range []string{"198.18.1.10:80/TCP", "198.18.2.10:80/TCP"} {
		v := findView(t, views, key)
		t.Logf("explain: %s", v.Line())
		if got := viewcheck.Shares(&v); !viewcheck.Same(got, map[string]float64{"198.19.21.2": 10, "198.19.21.3": 90}) {
			t.Errorf("explain %s: %v", key, got)
		}
	}
	// 3,000: sigma 0.55 points; 2.5 points = 4.5 sigma.
	split := map[string]float64{"lb-1": 10, "lb-2": 90}
	conns(t, f.client, "external IP", ap("198.18.1.10:80"), 3000, split, 2.5)
	conns(t, f.client, "load-balancer IP, allowed source", ap("198.18.2.10:80"), 3000, split, 2.5)
	conns(t, outsider, "external IP from the outsider (no ranges there)", ap("198.18.1.10:80"), 500, split, 6)
	dropped(t, outsider, "load-balancer IP from outside loadBalancerSourceRanges", ap("198.18.2.10:80"))
}

func caseExternalTrafficPolicyLocal(t *testing.T, m dpMode) {
	local := pService{
		name: "etp", clusterIPs: []string{"198.18.0.22"}, port: 80, targetPort: 8080, weights: "etp-1=1,etp-2=3,etp-3=6",
		endpoints: []pEndpoint{
			{name: "etp-1", ip: "198.19.22.2"}, {name: "etp-2", ip: "198.19.22.3"},
			{name: "etp-3", ip: "198.19.22.4", node: "other-node"},
		},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30082
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30992
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.2.20"}}
		},
	}
	remote := pService{
		name: "etp-none", clusterIPs: []string{"198.18.0.23"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{{name: "etp-r", ip: "198.19.22.5", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30083
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30993
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.18.2.21"}}
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(local, remote)
	f.writeParity("etp.yaml", local, remote)
	f.start()
	views := f.explain()
	for _, key := range []string{"0.0.0.0:30082/TCP", "198.18.2.20:80/TCP", "0.0.0.0:30083/TCP"} {
		t.Logf("explain: %s", findView(t, views, key).Line())
	}
	if v := findView(t, views, "0.0.0.0:30083/TCP"); !v.Drop || v.Policy != dataplane.PolicyLocal {
		t.Errorf("explain shows no drop for the Service without a local endpoint: %+v", v)
	}

	// Only local endpoints, weighted among themselves: 1:3.
	// 2,000 at 25/75: sigma 0.97 points; 4 points = 4.1 sigma.
	onlyLocal := map[string]float64{"etp-1": 25, "etp-2": 75}
	conns(t, f.client, "node port, Local policy", ap("198.19.254.1:30082"), 2000, onlyLocal, 4)
	conns(t, f.client, "load-balancer IP, Local policy", ap("198.18.2.20:80"), 2000, onlyLocal, 4)
	// The pod sees the client's own address.
	for _, dst := range []string{"198.19.254.1:30082", "198.18.2.20:80"} {
		line, err := f.client.FirstLine(netip.Addr{}, ap(dst), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: the pod answered %q", dst, line)
		if !strings.HasSuffix(line, " 198.19.254.2") {
			t.Errorf("%s: the pod saw %q, want the client's address 198.19.254.2", dst, line)
		}
	}
	// No local endpoint: dropped.
	dropped(t, f.client, "node port without a local endpoint", ap("198.19.254.1:30083"))
	dropped(t, f.client, "load-balancer IP without a local endpoint", ap("198.18.2.21:80"))

	// Health check node ports, as kube-proxy answers them.
	for _, tc := range []struct {
		port  string
		code  int
		count string
		svc   string
	}{
		{"30992", 200, `"localEndpoints":2`, `"name":"etp"`},
		{"30993", 503, `"localEndpoints":0`, `"name":"etp-none"`},
	} {
		code, body, err := f.client.HTTPGet("http://198.19.254.1:"+tc.port+"/healthz", 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("health check node port %s: %d %s", tc.port, code, strings.TrimSpace(body))
		if code != tc.code || !strings.Contains(body, tc.count) || !strings.Contains(body, tc.svc) {
			t.Errorf("health check node port %s: %d %s, want %d with %s", tc.port, code, body, tc.code, tc.count)
		}
	}
}

func caseInternalTrafficPolicyLocal(t *testing.T, m dpMode) {
	itp := pService{
		name: "itp", clusterIPs: []string{"198.18.0.24"}, port: 80, targetPort: 8080, weights: "itp-1=1,itp-2=3,itp-3=6",
		endpoints: []pEndpoint{
			{name: "itp-1", ip: "198.19.23.2"}, {name: "itp-2", ip: "198.19.23.3"},
			{name: "itp-3", ip: "198.19.23.4", node: "other-node"},
		},
		tweak: func(s *corev1.Service) {
			p := corev1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		},
	}
	none := pService{
		name: "itp-none", clusterIPs: []string{"198.18.0.25"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{{name: "itp-r", ip: "198.19.23.5", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			p := corev1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(itp, none)
	f.writeParity("itp.yaml", itp, none)
	f.start()
	t.Logf("explain: %s", findView(t, f.explain(), "198.18.0.24:80/TCP").Line())
	pod := f.sb.Pod("itp-3").NS
	conns(t, pod, "clusterIP from a pod, Local policy", ap("198.18.0.24:80"), 2000, map[string]float64{"itp-1": 25, "itp-2": 75}, 4)
	conns(t, f.sb.Node, "clusterIP from the node, Local policy", ap("198.18.0.24:80"), 2000, map[string]float64{"itp-1": 25, "itp-2": 75}, 4)
	dropped(t, pod, "clusterIP without a local endpoint", ap("198.18.0.25:80"))
}

// caseTerminatingFallbackPerCategory: the only local endpoint is serving
// and terminating while another node has a ready one. kube-proxy
// (CategorizeEndpoints) falls back per category: Local traffic keeps using
// the terminating local endpoint, cluster traffic the ready remote one, and
// the health check node port counts ready local endpoints only (0: 503).
func caseTerminatingFallbackPerCategory(t *testing.T, m dpMode) {
	etp := pService{
		name: "fb", clusterIPs: []string{"198.18.0.33"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{
			{name: "fb-1", ip: "198.19.29.2", terminating: true},
			{name: "fb-2", ip: "198.19.29.3", node: "other-node"},
		},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30087
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 30997
		},
	}
	itp := pService{
		name: "fbi", clusterIPs: []string{"198.18.0.34"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{
			{name: "fbi-1", ip: "198.19.29.4", terminating: true},
			{name: "fbi-2", ip: "198.19.29.5", node: "other-node"},
		},
		tweak: func(s *corev1.Service) {
			p := corev1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(etp, itp)
	f.writeParity("fallback.yaml", etp, itp)
	f.start()
	views := f.explain()
	for _, key := range []string{"0.0.0.0:30087/TCP", "198.18.0.33:80/TCP", "198.18.0.34:80/TCP"} {
		t.Logf("explain: %s", findView(t, views, key).Line())
	}
	// One endpoint per category: every connection goes to it (a single
	// stray one fails the test).
	conns(t, f.client, "node port, Local policy, only a terminating local endpoint", ap("198.19.254.1:30087"), 300, map[string]float64{"fb-1": 100}, 0)
	conns(t, f.client, "clusterIP, Cluster policy", ap("198.18.0.33:80"), 300, map[string]float64{"fb-2": 100}, 0)
	pod := f.sb.Pod("fbi-2").NS
	conns(t, pod, "clusterIP from a pod, internal Local policy", ap("198.18.0.34:80"), 300, map[string]float64{"fbi-1": 100}, 0)
	code, body, err := f.client.HTTPGet("http://198.19.254.1:30997/healthz", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("health check node port 30997: %d %s", code, strings.TrimSpace(body))
	if code != 503 || !strings.Contains(body, `"localEndpoints":0`) {
		t.Errorf("health check node port: %d %s, want 503 with 0 local endpoints (the local one is terminating)", code, body)
	}
}

// caseSessionAffinity matters in both iptables flavours: -m recent and
// -m addrtype go through the nft flavour's xtables compatibility layer.
func caseSessionAffinity(t *testing.T, m dpMode) {
	const timeout = 2
	aff := pService{
		name: "aff", clusterIPs: []string{"198.18.0.26"}, port: 80, targetPort: 8080, weights: "aff-1=20,aff-2=80",
		endpoints: []pEndpoint{{name: "aff-1", ip: "198.19.24.2"}, {name: "aff-2", ip: "198.19.24.3"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30084
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			sec := int32(timeout)
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(aff)
	f.writeParity("aff.yaml", aff)
	f.start()
	v := findView(t, f.explain(), "198.18.0.26:80/TCP")
	t.Logf("explain: %s", v.Line())
	if v.AffinitySeconds != timeout {
		t.Errorf("explain: affinity %d s, want %d", v.AffinitySeconds, timeout)
	}
	srcs, err := f.sb.AddAddrs(f.client, netip.MustParseAddr("198.19.254.20"), 30)
	if err != nil {
		t.Fatal(err)
	}

	// One client, 200 connections: one backend, through the VIP and the
	// node port alike.
	for _, dst := range []string{"198.18.0.26:80", "198.19.254.1:30084"} {
		r, err := f.client.TCPConnsAny(ap(dst), 200, sandbox.Load{Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one client, %s: %s", dst, r)
		if len(r.Counts) != 1 || r.Failed() > 0 {
			t.Errorf("one client reached %v (failed %d), want one backend", r.Counts, r.Failed())
		}
	}
	if m.name == "ebpf" {
		// The clusterIP's affinity is kept at the socket: no packet
		// carried the VIP (the node port's did, through nftables).
		out, _, err := f.sb.Node.Exec2("conntrack", "-L", "-p", "tcp")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "dst=198.18.0.26 ") || !strings.Contains(out, "dst=198.19.24.") {
			t.Errorf("ebpf: the node's conntrack should have connections to the aff pods and none to the VIP:\n%s", out)
		}
	}

	// Within the timeout a client keeps its backend; after it, it may move.
	first := map[netip.Addr]string{}
	for _, src := range srcs[:30] {
		line, err := f.client.FirstLine(src, ap("198.18.0.26:80"), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		first[src], _, _ = strings.Cut(line, " ")
	}
	moved := func() int {
		n := 0
		for _, src := range srcs[:30] {
			line, err := f.client.FirstLine(src, ap("198.18.0.26:80"), 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if name, _, _ := strings.Cut(line, " "); name != first[src] {
				n++
			}
			first[src], _, _ = strings.Cut(line, " ")
		}
		return n
	}
	if n := moved(); n != 0 {
		t.Errorf("%d of 30 clients changed backend within the timeout", n)
	}
	time.Sleep((timeout + 1) * time.Second)
	// Each client stays with probability 0.2^2 + 0.8^2 = 0.68: none of 30
	// moving has probability 1e-5.
	n := moved()
	t.Logf("after the %d s timeout, %d of 30 clients changed backend", timeout, n)
	if n == 0 {
		t.Error("no client changed backend after the timeout")
	}

	// Different clients are still split by weight: 8,000 new clients (the
	// client pool's addresses), one connection each. sigma(20%) =
	// sqrt(.2*.8/8000) = 0.45 points; 4.5 sigma is 2.0 points.
	const newClients = 8000
	pool, err := f.sb.AddPoolAddrs(f.client, newClients)
	if err != nil {
		t.Fatal(err)
	}
	counts, failed := map[string]int{}, map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan netip.Addr)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for src := range next {
				line, err := f.client.FirstLine(src, ap("198.18.0.26:80"), 2*time.Second)
				name, _, _ := strings.Cut(line, " ")
				mu.Lock()
				if err != nil {
					failed[err.Error()]++
				} else {
					counts[name]++
				}
				mu.Unlock()
			}
		}()
	}
	for _, src := range pool {
		next <- src
	}
	close(next)
	wg.Wait()
	tol := sandbox.ShareTolerance(20, newClients, 4.5)
	share := 100 * float64(counts["aff-1"]) / newClients
	t.Logf("%d new clients: %v (aff-1 %.2f%%, configured 20%%, sigma %.2f points)", newClients, counts, share, sandbox.ShareTolerance(20, newClients, 1))
	if len(failed) > 0 {
		t.Errorf("%d new clients: connections failed: %v", newClients, failed)
	}
	if math.Abs(share-20) > tol || len(counts) != 2 {
		t.Errorf("%d new clients: aff-1 got %.2f%%, want 20%% within %.1f points (4.5 sigma): %v", newClients, share, tol, counts)
	}
}

func caseTopologyHints(t *testing.T, m dpMode) {
	t.Setenv("NODE_ZONE", "zone-a")
	hinted := pService{
		name: "topo", clusterIPs: []string{"198.18.0.27"}, port: 80, targetPort: 8080, weights: "topo-1=1,topo-2=5,topo-3=3",
		endpoints: []pEndpoint{
			{name: "topo-1", ip: "198.19.25.2", zone: "zone-a", hints: []string{"zone-a"}},
			{name: "topo-2", ip: "198.19.25.3", node: "node-b", zone: "zone-b", hints: []string{"zone-b"}},
			{name: "topo-3", ip: "198.19.25.4", node: "node-c", zone: "zone-b", hints: []string{"zone-a"}},
		},
	}
	close := pService{
		name: "close", clusterIPs: []string{"198.18.0.28"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{
			{name: "close-1", ip: "198.19.25.5", node: "node-d", zone: "zone-a"},
			{name: "close-2", ip: "198.19.25.6", node: "node-b", zone: "zone-b"},
		},
		tweak: func(s *corev1.Service) {
			d := corev1.ServiceTrafficDistributionPreferClose
			s.Spec.TrafficDistribution = &d
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(hinted, close)
	f.writeParity("topo.yaml", hinted, close)
	f.start()
	t.Logf("explain: %s", findView(t, f.explain(), "198.18.0.27:80/TCP").Line())
	// Only the endpoints hinted for zone-a, weighted 1:3.
	conns(t, f.client, "hinted for this zone", ap("198.18.0.27:80"), 2000, map[string]float64{"topo-1": 25, "topo-3": 75}, 4)
	conns(t, f.client, "PreferClose", ap("198.18.0.28:80"), 500, map[string]float64{"close-1": 100}, 0)
}

// caseIPv6 checks a dual-stack Service's clusterIPs, and its node port in
// both families with nodePort.
func caseIPv6(t *testing.T, m dpMode, nodePort bool) {
	dual := pService{
		name: "v6", clusterIPs: []string{"198.18.0.29", "2001:2::50"}, port: 80, targetPort: 8080, weights: "v6-1=10,v6-2=90",
		endpoints:  []pEndpoint{{name: "v6-1", ip: "198.19.26.2"}, {name: "v6-2", ip: "198.19.26.3"}},
		endpoints6: []pEndpoint{{name: "v6-1", ip: "2001:2:0:1::2"}, {name: "v6-2", ip: "2001:2:0:1::3"}},
		tweak: func(s *corev1.Service) {
			if nodePort {
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30085
			}
			s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
			pol := corev1.IPFamilyPolicyRequireDualStack
			s.Spec.IPFamilyPolicy = &pol
		},
	}
	f := newFixture(t, m)
	if err := f.sb.EnableIPv6(); err != nil {
		t.Fatal(err)
	}
	if err := f.sb.AddClient6(f.client, netip.MustParseAddr("2001:2:0:fd::2")); err != nil {
		t.Fatal(err)
	}
	f.addSourcePods(dual)
	for _, e := range dual.endpoints6 {
		if err := f.sb.AddPod6(f.sb.Pod(e.name), netip.MustParseAddr(e.ip)); err != nil {
			t.Fatal(err)
		}
	}
	f.writeParity("v6.yaml", dual)
	f.start("--cluster-cidr", sandbox.ClusterCIDR6.String())
	views := f.explain()
	keys := []string{"198.18.0.29:80/TCP", "[2001:2::50]:80/TCP"}
	if nodePort {
		keys = append(keys, "[::]:30085/TCP", "0.0.0.0:30085/TCP")
	}
	for _, key := range keys {
		v := findView(t, views, key)
		t.Logf("explain: %s", v.Line())
	}
	if got := viewcheck.Shares(ptr(findView(t, views, "[2001:2::50]:80/TCP"))); !viewcheck.Same(got, map[string]float64{"2001:2:0:1::2": 10, "2001:2:0:1::3": 90}) {
		t.Errorf("explain IPv6: %v", got)
	}
	split := map[string]float64{"v6-1": 10, "v6-2": 90}
	// 5,000 at 10/90: 2 points = 4.7 sigma.
	conns(t, f.client, "IPv6 clusterIP", ap("[2001:2::50]:80"), 5000, split, 2)
	if nodePort {
		conns(t, f.client, "IPv6 node port", ap("[2001:2:0:fd::1]:30085"), 2000, split, 3)
	}
	conns(t, f.client, "IPv4 of the same Service", ap("198.18.0.29:80"), 2000, split, 3)
}

func ptr[T any](v T) *T { return &v }

func caseNodePortUDP(t *testing.T, m dpMode) {
	dns := svc{
		name: "np-dns", vip: "198.18.0.30", proto: corev1.ProtocolUDP, port: 53, targetPort: 5353,
		annotations: map[string]string{"steelyard.io/weights": "npd-1=10,npd-2=90"},
		endpoints:   []pod{{"npd-1", "198.19.27.2"}, {"npd-2", "198.19.27.3"}},
	}
	f := newFixture(t, m)
	f.addPods(dns)
	objs := dns.objects()
	svcObj := objs[0].(*corev1.Service)
	svcObj.Spec.Type = corev1.ServiceTypeNodePort
	svcObj.Spec.Ports[0].NodePort = 30053
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	if err := os.WriteFile(f.dir+"/dns.yaml", []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	f.start()
	t.Logf("explain: %s", findView(t, f.explain(), "0.0.0.0:30053/UDP").Line())
	// 3,000 flows at 10/90: sigma 0.55 points; 2.5 points = 4.5 sigma.
	r, err := f.client.UDPFlows(ap("198.19.254.1:30053"), 3000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("UDP node port: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"npd-1": 10, "npd-2": 90}, 2.5)
}
