//go:build gateway

// Package gateway tests the Gateway API layer against a real kube-apiserver
// (test/controlplane) with the CRDs of sigs.k8s.io/gateway-api's standard
// install manifest, the agent in a sandbox node namespace, and real
// connections from a client namespace to pod namespaces.
package gateway

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/controller/gateway"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

var steelyardBin string

func TestMain(m *testing.M) {
	bin, cleanup, err := sandbox.AgentBinary("gateway")
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
	steelyardBin = bin
	stop := sandbox.CloseOnSignal()
	code := m.Run()
	stop()
	cleanup()
	os.Exit(code)
}

// Names shared by the tests.
const (
	testNS    = "gw"
	otherNS   = "gw-other"
	leaseNS   = "steelyard"
	className = "steelyard"
	nodeName  = "node1"
	podPort   = 8080
	// pool is --gateway-address-pool: the first Gateway gets its first
	// usable address.
	pool        = "198.18.200.0/28"
	metricsAddr = "127.0.0.1:10279"
	healthzAddr = "127.0.0.1:10276"
)

// env is one test's world: control plane with the Gateway API CRDs, a
// sandbox (node, client, pods) and the agent with --gateway.
type env struct {
	t      *testing.T
	cp     *controlplane.ControlPlane
	admin  kubernetes.Interface
	gw     versioned.Interface
	sb     *sandbox.Sandbox
	client *sandbox.NS
	agent  *sandbox.Agent
	// mode is the agent's --mode flag, passed on to explain and verify.
	mode []string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	sandbox.RequireRoot(t)
	cp := controlplane.Start(t)
	sb := sandbox.NewT(t, sandbox.Options{})
	u, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	listen, err := netip.ParseAddrPort(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	stopRelay, err := sb.Node.Forward(listen, u.Host)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := versioned.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, cp: cp, admin: cp.Client(), gw: gw, sb: sb}
	t.Cleanup(func() {
		for _, a := range sb.Agents() {
			_ = a.Stop()
		}
		stopRelay()
	})
	if e.client, err = sb.AddClient(netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{testNS, otherNS, leaseNS} {
		if _, err := e.admin.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{
			ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	installCRDs(t, cp)
	if _, err := gw.GatewayV1().GatewayClasses().Create(t.Context(), &gwv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: className},
		Spec:       gwv1.GatewayClassSpec{ControllerName: gateway.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// crdDir is config/crd/standard of the gateway-api module in go.mod.
func crdDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/gateway-api: %v", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "standard")
}

// installCRDs creates every CustomResourceDefinition of the module's
// standard install manifest and waits until each is Established.
func installCRDs(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	files, err := filepath.Glob(filepath.Join(crdDir(t), "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRD manifests: %v", err)
	}
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(raw), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.GetKind() != "CustomResourceDefinition" {
				continue // the admission policy of safe upgrades is not needed
			}
			if _, err := crds.Create(t.Context(), u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("create CRD %s: %v", u.GetName(), err)
			}
			names = append(names, u.GetName())
		}
	}
	for _, n := range names {
		sandbox.Poll(t, 30*time.Second, 100*time.Millisecond, "CRD "+n+" Established", func() (bool, string) {
			u, err := crds.Get(t.Context(), n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, ""
				}
			}
			return false, "not Established"
		})
	}
	t.Logf("installed %d CRDs from %s", len(names), crdDir(t))
}

// startAgent runs the agent with --gateway and waits for its first sync.
func (e *env) startAgent(extra ...string) *sandbox.Agent {
	e.t.Helper()
	return e.startAgentWith(e.cp.Kubeconfig, extra...)
}

// startAgentWith is startAgent with another kubeconfig.
func (e *env) startAgentWith(kubeconfig string, extra ...string) *sandbox.Agent {
	e.t.Helper()
	args := append([]string{
		"run", "--kubeconfig", kubeconfig, "--node-name", nodeName,
		"--cluster-cidr", sandbox.ClusterCIDR.String(),
		"--metrics-bind-address", metricsAddr, "--healthz-bind-address", healthzAddr,
		"--log-level", "debug", "--gateway", "--gateway-address-pool", pool, "--gateway-lease-namespace", leaseNS,
	}, extra...)
	for i := 0; i+1 < len(extra); i++ {
		if extra[i] == "--mode" {
			e.mode = []string{"--mode", extra[i+1]}
		}
	}
	a, err := e.sb.StartAgent(steelyardBin, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.agent = a
	sandbox.Poll(e.t, 30*time.Second, 20*time.Millisecond, "the agent's first sync", func() (bool, string) {
		if exited, err := a.Exited(); exited {
			e.t.Fatalf("agent exited: %v\n%s", err, a.Log())
		}
		return strings.Contains(a.Log(), "msg=synced"), "no synced line"
	})
	return a
}

type backend struct{ pod, ip string }

func (e *env) addPods(bs ...backend) {
	e.t.Helper()
	for _, b := range bs {
		if _, err := e.sb.AddPod(b.pod, netip.MustParseAddr(b.ip), podPort); err != nil {
			e.t.Fatal(err)
		}
	}
}

// service creates a ClusterIP Service ns/name with TCP and UDP port 80 ->
// 8080 and its EndpointSlice of bs.
func (e *env) service(ns, name, vip string, annotations map[string]string, bs ...backend) {
	e.t.Helper()
	ctx := e.t.Context()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: vip,
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(podPort)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(podPort)},
			},
		},
	}
	if _, err := e.admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create Service %s: %v", name, err)
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "steelyard-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](podPort)},
			{Name: ptr.To("udp"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](podPort)},
		},
	}
	for _, b := range bs {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{b.ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: b.pod},
		})
	}
	if _, err := e.admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create EndpointSlice %s: %v", sl.Name, err)
	}
}

// annotate sets an annotation of Service ns/name.
func (e *env) annotate(ns, name, key, value string) {
	e.t.Helper()
	svcs := e.admin.CoreV1().Services(ns)
	svc, err := svcs.Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[key] = value
	if _, err := svcs.Update(e.t.Context(), svc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// newGateway creates a Gateway of our class with these listeners.
func (e *env) newGateway(name string, ls ...gwv1.Listener) {
	e.t.Helper()
	if _, err := e.gw.GatewayV1().Gateways(testNS).Create(e.t.Context(), &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec:       gwv1.GatewaySpec{GatewayClassName: className, Listeners: ls},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func listener(name string, proto gwv1.ProtocolType, port int32) gwv1.Listener {
	return gwv1.Listener{Name: gwv1.SectionName(name), Protocol: proto, Port: gwv1.PortNumber(port)}
}

// ref is a backendRef to Service ns/name port 80 with weight w (<0: unset).
func ref(ns, name string, w int32) gwv1.BackendRef {
	r := gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: gwv1.ObjectName(name), Port: ptr.To[gwv1.PortNumber](80)}}
	if ns != "" {
		r.Namespace = ptr.To(gwv1.Namespace(ns))
	}
	if w >= 0 {
		r.Weight = ptr.To(w)
	}
	return r
}

func gatewayParent(gw, section string) gwv1.ParentReference {
	p := gwv1.ParentReference{Name: gwv1.ObjectName(gw)}
	if section != "" {
		p.SectionName = ptr.To(gwv1.SectionName(section))
	}
	return p
}

func serviceParent(svc string) gwv1.ParentReference {
	return gwv1.ParentReference{Group: ptr.To(gwv1.Group("")), Kind: ptr.To(gwv1.Kind("Service")), Name: gwv1.ObjectName(svc), Port: ptr.To[gwv1.PortNumber](80)}
}

func (e *env) tcpRoute(ns, name string, parents []gwv1.ParentReference, refs ...gwv1.BackendRef) {
	e.t.Helper()
	r := &gwv1.TCPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwv1.TCPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: parents},
			Rules: []gwv1.TCPRouteRule{{BackendRefs: refs}}},
	}
	if _, err := e.gw.GatewayV1().TCPRoutes(ns).Create(e.t.Context(), r, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) udpRoute(ns, name string, parents []gwv1.ParentReference, refs ...gwv1.BackendRef) {
	e.t.Helper()
	r := &gwv1.UDPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: gwv1.UDPRouteSpec{CommonRouteSpec: gwv1.CommonRouteSpec{ParentRefs: parents},
			Rules: []gwv1.UDPRouteRule{{BackendRefs: refs}}},
	}
	if _, err := e.gw.GatewayV1().UDPRoutes(ns).Create(e.t.Context(), r, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// setTCPWeights sets the weights of the first rule's backendRefs.
func (e *env) setTCPWeights(ns, name string, ws ...int32) {
	e.t.Helper()
	routes := e.gw.GatewayV1().TCPRoutes(ns)
	r, err := routes.Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for i, w := range ws {
		r.Spec.Rules[0].BackendRefs[i].Weight = ptr.To(w)
	}
	if _, err := routes.Update(e.t.Context(), r, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// gatewayAddress waits for status.addresses of Gateway name and returns
// the first.
func (e *env) gatewayAddress(name string) netip.Addr {
	e.t.Helper()
	var addr netip.Addr
	sandbox.Poll(e.t, 20*time.Second, 50*time.Millisecond, "Gateway "+name+" status.addresses", func() (bool, string) {
		g, err := e.gw.GatewayV1().Gateways(testNS).Get(e.t.Context(), name, metav1.GetOptions{})
		if err != nil || len(g.Status.Addresses) == 0 {
			return false, fmt.Sprint(err)
		}
		addr, err = netip.ParseAddr(g.Status.Addresses[0].Value)
		return err == nil, fmt.Sprint(err)
	})
	return addr
}

// waitCondition polls until conds() holds condition typ with status and
// reason, and returns the condition.
func waitCondition(t *testing.T, what, typ string, status metav1.ConditionStatus, reason string, conds func() ([]metav1.Condition, error)) metav1.Condition {
	t.Helper()
	var found metav1.Condition
	sandbox.Poll(t, 20*time.Second, 50*time.Millisecond, fmt.Sprintf("%s: %s=%s (%s)", what, typ, status, reason), func() (bool, string) {
		cs, err := conds()
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(cs, typ)
		if c == nil {
			return false, fmt.Sprintf("conditions %+v", cs)
		}
		found = *c
		return c.Status == status && (reason == "" || c.Reason == reason), fmt.Sprintf("%s=%s reason %s: %s", c.Type, c.Status, c.Reason, c.Message)
	})
	t.Logf("%s: %s=%s reason %s %q", what, found.Type, found.Status, found.Reason, found.Message)
	return found
}

// tcpRouteConds returns the conditions of our parent entry of a TCPRoute
// (the first one whose parentRef has this name).
func (e *env) tcpRouteConds(ns, name, parent string) func() ([]metav1.Condition, error) {
	return func() ([]metav1.Condition, error) {
		r, err := e.gw.GatewayV1().TCPRoutes(ns).Get(e.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return parentConds(r.Status.Parents, parent), nil
	}
}

func (e *env) udpRouteConds(ns, name, parent string) func() ([]metav1.Condition, error) {
	return func() ([]metav1.Condition, error) {
		r, err := e.gw.GatewayV1().UDPRoutes(ns).Get(e.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return parentConds(r.Status.Parents, parent), nil
	}
}

func parentConds(ps []gwv1.RouteParentStatus, parent string) []metav1.Condition {
	for _, p := range ps {
		if p.ControllerName == gateway.ControllerName && string(p.ParentRef.Name) == parent {
			return p.Conditions
		}
	}
	return nil
}

func (e *env) gatewayConds(name string) func() ([]metav1.Condition, error) {
	return func() ([]metav1.Condition, error) {
		g, err := e.gw.GatewayV1().Gateways(testNS).Get(e.t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return g.Status.Conditions, nil
	}
}

func (e *env) listenerConds(gw, name string) func() ([]metav1.Condition, error) {
	return func() ([]metav1.Condition, error) {
		g, err := e.gw.GatewayV1().Gateways(testNS).Get(e.t.Context(), gw, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		for _, l := range g.Status.Listeners {
			if string(l.Name) == name {
				return l.Conditions, nil
			}
		}
		return nil, nil
	}
}

// explain returns `steelyard explain -o json` of the node namespace.
func (e *env) explain() []dataplane.ServiceView {
	e.t.Helper()
	out, errOut, err := e.sb.Node.Exec2(append([]string{steelyardBin, "explain", "-o", "json"}, e.mode...)...)
	if err != nil {
		e.t.Fatalf("explain: %v: %s", err, errOut)
	}
	var views []dataplane.ServiceView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		e.t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	return views
}

// findView returns the view of ip:port/proto, or nil.
func findView(views []dataplane.ServiceView, ip string, port uint16, proto dataplane.Protocol) *dataplane.ServiceView {
	for i := range views {
		v := &views[i]
		if v.VIP == ip && v.Port == port && v.Protocol == proto {
			return v
		}
	}
	return nil
}

// waitShares polls explain until ip:80/proto shows want (backend IP ->
// percent) and returns how long that took and the view.
func (e *env) waitShares(ip string, proto dataplane.Protocol, want map[string]float64, timeout time.Duration) (time.Duration, dataplane.ServiceView) {
	e.t.Helper()
	return e.waitSharesPort(ip, 80, proto, want, timeout)
}

// waitSharesPort is waitShares for another port.
func (e *env) waitSharesPort(ip string, port uint16, proto dataplane.Protocol, want map[string]float64, timeout time.Duration) (time.Duration, dataplane.ServiceView) {
	e.t.Helper()
	var view dataplane.ServiceView
	took := sandbox.Poll(e.t, timeout, 10*time.Millisecond, fmt.Sprintf("explain %s:%d/%s showing %v", ip, port, proto, want), func() (bool, string) {
		v := findView(e.explain(), ip, port, proto)
		if v == nil {
			return false, "not in explain"
		}
		view = *v
		got := viewcheck.Shares(v)
		return viewcheck.Same(got, want), fmt.Sprintf("explain shows %v", got)
	})
	return took, view
}

// verify runs `steelyard verify --gateway` and returns its output and code.
func (e *env) verify() (string, int) {
	args := []string{"verify", "--kubeconfig", e.cp.Kubeconfig, "--gateway", "--gateway-address-pool", pool}
	args = append(args, e.mode...)
	o, s, err := e.sb.Node.Exec2(append([]string{steelyardBin}, args...)...)
	return o + s, sandbox.ExitCode(err)
}

func (e *env) waitVerify() {
	e.t.Helper()
	sandbox.Poll(e.t, 10*time.Second, 100*time.Millisecond, "verify --gateway", func() (bool, string) {
		out, code := e.verify()
		return code == 0, fmt.Sprintf("exit %d:\n%s", code, out)
	})
}

// events returns the Events about object kind/name in ns.
func (e *env) events(ns, kind, name string) []corev1.Event {
	e.t.Helper()
	list, err := e.admin.CoreV1().Events(ns).List(e.t.Context(), metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

// median of durations.
func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func decodeViews(t *testing.T, out string) []dataplane.ServiceView {
	t.Helper()
	var views []dataplane.ServiceView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	return views
}

func formatMap(m map[string]float64) string { return fmt.Sprint(m) }
