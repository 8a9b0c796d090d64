// Package harness is the world of the L7 tests and benchmark: a real
// kube-apiserver and etcd, a sandbox node namespace where the agent runs
// with --ingress (its iptables VIPs and its nginx child), pod namespaces
// whose HTTP servers answer with the pod's name, and a client namespace
// that sends HTTP(S) requests to nginx on the node's LAN address.
//
// Addresses come from the sandbox's IP plan (198.18.0.0/16 VIPs,
// 198.19.0.0/16 pods, node and clients); nothing touches the machine's own
// network namespace.
package harness

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Names and ports shared by the suite and the benchmark.
const (
	Namespace   = "ingress"
	ClassName   = "steelyard"
	Controller  = "steelyard.io/ingress-nginx"
	ConfigMap   = "nginx-settings"
	NodeName    = "node1"
	PodPort     = 8080
	ServicePort = 80
	MetricsAddr = "127.0.0.1:10279"
	HealthzAddr = "127.0.0.1:10276"
	managedBy   = "steelyard-ingress-test"
)

// NginxAddr is where nginx listens as the clients see it (the node's LAN
// address), HTTP and HTTPS.
var (
	NginxHTTP  = netip.AddrPortFrom(sandbox.NodeLANIP, 80)
	NginxHTTPS = netip.AddrPortFrom(sandbox.NodeLANIP, 443)
)

// World is one control plane, sandbox, client and agent.
type World struct {
	CP     *controlplane.ControlPlane
	Admin  kubernetes.Interface
	SB     *sandbox.Sandbox
	Client *sandbox.NS
	Agent  *sandbox.Agent
	// NginxDir is the agent's --nginx-dir.
	NginxDir string

	logf      func(string, ...any)
	stopRelay func()
	mu        sync.Mutex
	pods      map[string]*Pod
}

// New relays the API server into the node namespace, adds a client,
// creates the test namespace and the IngressClass.
func New(ctx context.Context, cp *controlplane.ControlPlane, sb *sandbox.Sandbox, logf func(string, ...any)) (*World, error) {
	w := &World{CP: cp, Admin: cp.Client(), SB: sb, logf: logf, pods: map[string]*Pod{}}
	u, err := url.Parse(cp.URL)
	if err != nil {
		return nil, err
	}
	listen, err := netip.ParseAddrPort(u.Host)
	if err != nil {
		return nil, err
	}
	if w.stopRelay, err = sb.Node.Forward(listen, u.Host); err != nil {
		return nil, fmt.Errorf("relay to the API server: %w", err)
	}
	if w.Client, err = sb.AddClient(netip.Addr{}); err != nil {
		return nil, err
	}
	// Many fresh connections from one node address to nginx's upstreams.
	if err := sb.Node.WriteSysctl("net/ipv4/ip_local_port_range", "1024 65535"); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "steelyard-nginx-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	w.NginxDir = dir
	if _, err := w.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	_, err = w.Admin.NetworkingV1().IngressClasses().Create(ctx, &networkingv1.IngressClass{
		ObjectMeta: metav1.ObjectMeta{Name: ClassName},
		Spec:       networkingv1.IngressClassSpec{Controller: Controller},
	}, metav1.CreateOptions{})
	return w, err
}

// Close stops the agent (and with it nginx), the pods' servers and the relay.
func (w *World) Close() {
	if w.Agent != nil {
		_ = w.Agent.Stop()
	}
	w.mu.Lock()
	for _, p := range w.pods {
		p.close()
	}
	w.mu.Unlock()
	if w.stopRelay != nil {
		w.stopRelay()
	}
	if w.NginxDir != "" {
		os.RemoveAll(w.NginxDir)
	}
}

// AgentArgs are the flags of the agent: the API server, iptables and
// --ingress with its ConfigMap; extra flags come last and win.
func (w *World) AgentArgs(extra ...string) []string {
	return append([]string{
		"run", "--kubeconfig", w.CP.Kubeconfig, "--node-name", NodeName,
		"--cluster-cidr", sandbox.ClusterCIDR.String(),
		"--metrics-bind-address", MetricsAddr, "--healthz-bind-address", HealthzAddr,
		"--ingress", "--nginx", NginxBinary(), "--nginx-dir", w.NginxDir,
		"--ingress-configmap", Namespace + "/" + ConfigMap,
		"--min-sync-period", "100ms",
	}, extra...)
}

// StartAgent starts the agent and waits until nginx answers.
func (w *World) StartAgent(bin string, extra ...string) error {
	a, err := w.SB.StartAgent(bin, w.AgentArgs(extra...)...)
	if err != nil {
		return err
	}
	w.Agent = a
	deadline := time.Now().Add(60 * time.Second)
	for {
		if exited, err := a.Exited(); exited {
			return fmt.Errorf("agent exited: %v\n%s", err, Tail(a.Log(), 40))
		}
		if _, _, err := w.Get("nothing.example", "/", nil); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nginx did not answer within 60 s\n%s", Tail(a.Log(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pod is a pod namespace whose HTTP server answers every request with the
// pod's name and a newline.
type Pod struct {
	Name     string
	IP       netip.Addr
	Requests atomic.Int64
	srv      *http.Server
}

func (p *Pod) close() { _ = p.srv.Close() }

// AddPod adds a pod namespace with an HTTP server on PodPort.
func (w *World) AddPod(name, ip string) (*Pod, error) {
	sp, err := w.SB.AddPod(name, netip.MustParseAddr(ip))
	if err != nil {
		return nil, err
	}
	var ln net.Listener
	if err := sp.NS.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", PodPort))
		return err
	}); err != nil {
		return nil, err
	}
	p := &Pod{Name: name, IP: sp.IP}
	body := []byte(name + "\n")
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			p.Requests.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			rw.Header().Set("Content-Type", "text/plain")
			// Request headers the proxy set, for header filter tests.
			for _, k := range []string{"X-Env", "X-Trace", "X-Drop"} {
				if v := r.Header.Get(k); v != "" {
					rw.Header().Set("X-Seen-"+k, v)
				}
			}
			rw.Header().Set("X-Seen-Path", r.URL.RequestURI())
			rw.Header().Set("X-Seen-Host", r.Host)
			_, _ = rw.Write(body)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
	}
	go func() { _ = p.srv.Serve(ln) }()
	w.mu.Lock()
	w.pods[name] = p
	w.mu.Unlock()
	return p, nil
}

// Service creates a ClusterIP Service with port "http" 80 -> 8080.
func (w *World) Service(ctx context.Context, name, vip string, annotations map[string]string) error {
	_, err := w.Admin.CoreV1().Services(Namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, Annotations: annotations},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: vip,
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: ServicePort, TargetPort: intstr.FromInt32(PodPort)}},
		},
	}, metav1.CreateOptions{})
	return err
}

// SetEndpoints creates or replaces the EndpointSlice "<svc>-1" with a ready
// endpoint per pod.
func (w *World) SetEndpoints(ctx context.Context, svc string, pods ...string) error {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: Namespace, Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: managedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](PodPort)}},
	}
	for _, name := range pods {
		w.mu.Lock()
		p := w.pods[name]
		w.mu.Unlock()
		if p == nil {
			return fmt.Errorf("no pod %s", name)
		}
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: Namespace, Name: name},
		})
	}
	slices := w.Admin.DiscoveryV1().EndpointSlices(Namespace)
	old, err := slices.Get(ctx, sl.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = slices.Create(ctx, sl, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	sl.ResourceVersion = old.ResourceVersion
	_, err = slices.Update(ctx, sl, metav1.UpdateOptions{})
	return err
}

// Apply creates or replaces an Ingress of Namespace (class ClassName
// unless set).
func (w *World) Apply(ctx context.Context, ing *networkingv1.Ingress) error {
	ing.Namespace = Namespace
	if ing.Spec.IngressClassName == nil {
		ing.Spec.IngressClassName = ptr.To(ClassName)
	}
	c := w.Admin.NetworkingV1().Ingresses(Namespace)
	old, err := c.Get(ctx, ing.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = c.Create(ctx, ing, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	ing.ResourceVersion = old.ResourceVersion
	_, err = c.Update(ctx, ing, metav1.UpdateOptions{})
	return err
}

// Settings creates or replaces the nginx settings ConfigMap.
func (w *World) Settings(ctx context.Context, data map[string]string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: ConfigMap}, Data: data}
	c := w.Admin.CoreV1().ConfigMaps(Namespace)
	if _, err := c.Get(ctx, ConfigMap, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		_, err = c.Create(ctx, cm, metav1.CreateOptions{})
		return err
	}
	_, err := c.Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// Rule is one host's paths, for IngressOf.
type Rule struct {
	Host  string
	Paths []Path
}

// Path is one Ingress path and the Service behind it.
type Path struct {
	Path    string
	Type    networkingv1.PathType
	Service string
}

// IngressOf builds an Ingress from rules.
func IngressOf(name string, rules ...Rule) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, r := range rules {
		ir := networkingv1.IngressRule{Host: r.Host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
		for _, p := range r.Paths {
			ir.HTTP.Paths = append(ir.HTTP.Paths, networkingv1.HTTPIngressPath{
				Path: p.Path, PathType: ptr.To(p.Type), Backend: Backend(p.Service),
			})
		}
		ing.Spec.Rules = append(ing.Spec.Rules, ir)
	}
	return ing
}

// Backend is a Service backend on port ServicePort.
func Backend(svc string) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: ServicePort}}}
}

// dialer dials from the client namespace.
func (w *World) dialer(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := w.Client.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// HTTPClient returns a client whose connections start in the client
// namespace and go to nginx whatever the URL's host (so URLs carry the
// virtual host, and TLS sends it as SNI). keepAlive false opens a fresh
// connection per request.
func (w *World) HTTPClient(tlsConf *tls.Config, keepAlive bool, conns int, timeout time.Duration) *http.Client {
	dial := w.dialer(timeout)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			target := NginxHTTP
			if port == "443" {
				target = NginxHTTPS
			}
			return dial(ctx, network, target.String())
		},
		TLSClientConfig:     tlsConf,
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     time.Minute,
	}
	// Redirects are answers to check, not to follow.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: noRedirect}
}

// Get sends one request (fresh connection) for host and path; tlsConf nil
// means plain HTTP. It returns the status and the body without its newline.
func (w *World) Get(host, path string, tlsConf *tls.Config) (int, string, error) {
	c := w.HTTPClient(tlsConf, false, 1, 5*time.Second)
	defer c.CloseIdleConnections()
	scheme := "http"
	if tlsConf != nil {
		scheme = "https"
	}
	resp, err := c.Get(scheme + "://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// Metric reads one unlabelled metric of the agent's /metrics.
func (w *World) Metric(name string) (float64, error) {
	code, body, err := w.SB.Node.HTTPGet("http://"+MetricsAddr+"/metrics", 5*time.Second)
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("/metrics: status %d", code)
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

// Conf returns the running nginx.conf.
func (w *World) Conf() (string, error) {
	b, err := os.ReadFile(filepath.Join(w.NginxDir, "nginx.conf"))
	return string(b), err
}

// NginxPid returns the nginx master's PID from its pid file.
func (w *World) NginxPid() (int, error) {
	b, err := os.ReadFile(filepath.Join(w.NginxDir, "nginx.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Events returns the Events of an object of Namespace, as "Type Reason: message".
func (w *World) Events(ctx context.Context, kind, name string) ([]string, error) {
	list, err := w.Admin.CoreV1().Events(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name {
			out = append(out, e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	return out, nil
}

// NginxBinary is the nginx the agent runs: $NGINX, else nginx from PATH,
// else /usr/sbin/nginx (Debian's).
func NginxBinary() string {
	if p := os.Getenv("NGINX"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "nginx"
}

// ErrClass names an error for tallies: timeout, refused, reset, eof, other.
func ErrClass(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case strings.Contains(err.Error(), "refused"):
		return "refused"
	case strings.Contains(err.Error(), "reset"):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "EOF"):
		return "eof"
	}
	return "other"
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// NginxGroup returns the PIDs of the live (not zombie) nginx processes in
// process group pgid
// (the agent starts nginx's master as a group leader, so the group is the
// master's PID; workers stay in it).
func NginxGroup(pgid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != "nginx" {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			if pid, err := strconv.Atoi(strings.TrimSpace(s[:open])); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}
