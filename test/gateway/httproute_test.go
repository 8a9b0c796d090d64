//go:build gateway

package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/steelyard-net/steelyard/controller/gateway"
	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/ingress/harness"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// httpPort is the Gateway's HTTP listener; the Ingress ports (80, 443) are
// nginx's own.
const (
	httpPort  = 8080
	httpsPort = 8443
)

// selfSignedCert returns a certificate for host, its key (PEM) and a pool
// that trusts it.
func selfSignedCert(t *testing.T, host string) (crt, key []byte, pool *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), pool
}

// TestHTTPRoute: HTTPRoutes on an HTTP listener of a Gateway, served by the
// agent's nginx (--gateway --ingress) with Service VIPs as upstreams:
// matches by host, path, method, header and query; a weighted split
// measured with fresh connections; a redirect and header modifiers; a route
// with an unsafe value reported and not served, the others untouched; TLS
// termination on an HTTPS listener; no reload for endpoint churn. The
// Gateway address is not the node's: requests reach nginx through the
// dataplane's forward, in the iptables and nftables modes.
func TestHTTPRoute(t *testing.T) {
	for _, mode := range []string{"iptables", "nftables"} {
		t.Run(mode, func(t *testing.T) { testHTTPRoute(t, mode) })
	}
}

func testHTTPRoute(t *testing.T, mode string) {
	sandbox.RequireRoot(t)
	if harness.NginxBinary() == "" {
		t.Fatal("nginx not installed (scripts/install-deps.sh)")
	}
	ctx := t.Context()
	cp := controlplane.Start(t)
	sb := sandbox.NewT(t, sandbox.Options{})
	w, err := harness.New(ctx, cp, sb, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	installCRDs(t, cp)
	gc, err := versioned.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.GatewayV1().GatewayClasses().Create(ctx, &gwv1.GatewayClass{
		ObjectMeta: metav1.ObjectMeta{Name: className}, Spec: gwv1.GatewayClassSpec{ControllerName: gateway.ControllerName},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"a", "b", "c"} {
		if _, err := w.AddPod(name, fmt.Sprintf("198.19.1.%d", i+1)); err != nil {
			t.Fatal(err)
		}
		svc := "s-" + name
		if err := w.Service(ctx, svc, fmt.Sprintf("198.18.0.%d", 10+i), nil); err != nil {
			t.Fatal(err)
		}
		if err := w.SetEndpoints(ctx, svc, name); err != nil {
			t.Fatal(err)
		}
	}
	crt, key, roots := selfSignedCert(t, "split.example")
	if _, err := w.Admin.CoreV1().Secrets(harness.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gw-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ipType := gwv1.IPAddressType
	if _, err := gc.GatewayV1().Gateways(harness.Namespace).Create(ctx, &gwv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: gwv1.GatewaySpec{GatewayClassName: className,
			Addresses: []gwv1.GatewaySpecAddress{{Type: &ipType, Value: gatewayAddr.String()}},
			Listeners: []gwv1.Listener{{Name: "http", Protocol: gwv1.HTTPProtocolType, Port: httpPort},
				{Name: "https", Protocol: gwv1.HTTPSProtocolType, Port: httpsPort, TLS: &gwv1.ListenerTLSConfig{
					CertificateRefs: []gwv1.SecretObjectReference{{Name: "gw-cert"}}}},
				// conformance GatewayInvalidTLSConfiguration: a missing Secret
				{Name: "bad-tls", Protocol: gwv1.HTTPSProtocolType, Port: httpsPort + 1, TLS: &gwv1.ListenerTLSConfig{
					CertificateRefs: []gwv1.SecretObjectReference{{Name: "nonexistent"}}}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	be := func(svc string, weight int32) gwv1.HTTPBackendRef {
		return gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{Weight: ptr.To(weight), BackendObjectReference: gwv1.BackendObjectReference{
			Name: gwv1.ObjectName(svc), Port: ptr.To(gwv1.PortNumber(harness.ServicePort))}}}
	}
	prefix := func(p string) *gwv1.HTTPPathMatch {
		return &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchPathPrefix), Value: ptr.To(p)}
	}
	routes := map[string]gwv1.HTTPRouteSpec{
		"split": {Hostnames: []gwv1.Hostname{"split.example"}, Rules: []gwv1.HTTPRouteRule{
			{BackendRefs: []gwv1.HTTPBackendRef{be("s-a", 80), be("s-b", 20), be("s-c", 0)}}}},
		"match": {Hostnames: []gwv1.Hostname{"match.example"}, Rules: []gwv1.HTTPRouteRule{
			{Matches: []gwv1.HTTPRouteMatch{{Path: &gwv1.HTTPPathMatch{Type: ptr.To(gwv1.PathMatchExact), Value: ptr.To("/x")},
				Headers: []gwv1.HTTPHeaderMatch{{Name: "X-Pick", Value: "b"}}}}, BackendRefs: []gwv1.HTTPBackendRef{be("s-b", 1)}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/api"), Method: ptr.To(gwv1.HTTPMethodPost)}}, BackendRefs: []gwv1.HTTPBackendRef{be("s-c", 1)}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/q"), QueryParams: []gwv1.HTTPQueryParamMatch{{Name: "v", Value: "c"}}}}, BackendRefs: []gwv1.HTTPBackendRef{be("s-c", 1)}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/")}}, BackendRefs: []gwv1.HTTPBackendRef{be("s-a", 1)}},
		}},
		"filters": {Hostnames: []gwv1.Hostname{"filters.example"}, Rules: []gwv1.HTTPRouteRule{
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/old")}}, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
				RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Hostname: ptr.To(gwv1.PreciseHostname("new.example")), StatusCode: ptr.To(301),
					Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}}}}},
			// The extended redirect codes (conformance HTTPRoute303Redirect, ...).
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/c303")}}, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
				RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Hostname: ptr.To(gwv1.PreciseHostname("new.example")), StatusCode: ptr.To(303)}}}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/c307")}}, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
				RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Hostname: ptr.To(gwv1.PreciseHostname("new.example")), StatusCode: ptr.To(307)}}}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/c308")}}, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
				RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Scheme: ptr.To("https"), Hostname: ptr.To(gwv1.PreciseHostname("new.example")), StatusCode: ptr.To(308)}}}},
			{Matches: []gwv1.HTTPRouteMatch{{Path: prefix("/v1")}}, Filters: []gwv1.HTTPRouteFilter{
				{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "X-Env", Value: "prod west"}}, Remove: []string{"X-Drop"}}},
				{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{Set: []gwv1.HTTPHeader{{Name: "X-Served-By", Value: "steelyard"}}}},
				{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v2")}}},
			}, BackendRefs: []gwv1.HTTPBackendRef{be("s-a", 1)}},
		}},
		// Every backendRef invalid: 500 (conformance
		// HTTPRouteInvalidBackendRefUnknownKind found nginx answering 404).
		"broken": {Hostnames: []gwv1.Hostname{"broken.example"}, Rules: []gwv1.HTTPRouteRule{
			{BackendRefs: []gwv1.HTTPBackendRef{be("nonexistent", 1)}}}},
		// A value that would end nginx's string: refused, reported, not served.
		"bad": {Hostnames: []gwv1.Hostname{"bad.example"}, Rules: []gwv1.HTTPRouteRule{
			{Matches: []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A", Value: `a"; return 200 "pwned`}}}}, BackendRefs: []gwv1.HTTPBackendRef{be("s-a", 1)}}}},
	}
	for name, spec := range routes {
		spec.ParentRefs = []gwv1.ParentReference{{Name: "web"}}
		if _, err := gc.GatewayV1().HTTPRoutes(harness.Namespace).Create(ctx, &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			// The CRDs of go.mod (v1.6.3) put no pattern on header
			// values, so the bad route must reach the agent: its refusal
			// is what BadRouteIsolated tests (it used to skip instead).
			t.Fatalf("create HTTPRoute %s: %v", name, err)
		}
	}
	if err := w.StartAgent(steelyardBin, "--mode", mode, "--gateway", "--gateway-lease-namespace", leaseNS); err != nil {
		t.Fatal(err)
	}
	routeConds := func(name string) func() ([]metav1.Condition, error) {
		return func() ([]metav1.Condition, error) {
			r, err := gc.GatewayV1().HTTPRoutes(harness.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			return parentConds(r.Status.Parents, "web"), nil
		}
	}
	for _, name := range []string{"split", "match", "filters"} {
		waitCondition(t, "HTTPRoute "+name, "Accepted", metav1.ConditionTrue, "Accepted", routeConds(name))
		waitCondition(t, "HTTPRoute "+name, "ResolvedRefs", metav1.ConditionTrue, "ResolvedRefs", routeConds(name))
	}
	c := waitCondition(t, "HTTPRoute bad", "Accepted", metav1.ConditionFalse, "UnsupportedValue", routeConds("bad"))
	t.Logf("bad route: %s", c.Message)
	lc := func() ([]metav1.Condition, error) {
		g, err := gc.GatewayV1().Gateways(harness.Namespace).Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) == 0 {
			return nil, err
		}
		return g.Status.Listeners[0].Conditions, nil
	}
	waitCondition(t, "listener http", "Programmed", metav1.ConditionTrue, "Programmed", lc)
	badTLS := func() ([]metav1.Condition, error) {
		g, err := gc.GatewayV1().Gateways(harness.Namespace).Get(ctx, "web", metav1.GetOptions{})
		if err != nil || len(g.Status.Listeners) < 3 {
			return nil, err
		}
		return g.Status.Listeners[2].Conditions, nil
	}
	waitCondition(t, "listener bad-tls", "ResolvedRefs", metav1.ConditionFalse, "InvalidCertificateRef", badTLS)
	waitCondition(t, "listener bad-tls", "Programmed", metav1.ConditionFalse, "Invalid", badTLS)

	client := gatewayClient(w)
	get := func(method, host, path string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://%s:%d%s", host, httpPort, path), nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s%s: %v", method, host, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, strings.TrimSpace(string(b))
	}
	sandbox.Poll(t, 30*time.Second, 100*time.Millisecond, "nginx serves the HTTPRoutes", func() (bool, string) {
		resp, body := get("GET", "split.example", "/", nil)
		return resp.StatusCode == 200, fmt.Sprintf("%d %s", resp.StatusCode, body)
	})

	t.Run("Matching", func(t *testing.T) {
		for _, c := range []struct {
			method, host, path string
			hdr                map[string]string
			code               int
			body               string
		}{
			{"GET", "match.example", "/x", map[string]string{"X-Pick": "b"}, 200, "b"},
			{"GET", "match.example", "/x", map[string]string{"X-Pick": "B"}, 200, "a"},  // values match exactly
			{"GET", "match.example", "/x/", map[string]string{"X-Pick": "b"}, 200, "a"}, // Exact is not a prefix
			{"POST", "match.example", "/api/v1", nil, 200, "c"},
			{"GET", "match.example", "/api/v1", nil, 200, "a"},
			{"POST", "match.example", "/apiary", nil, 200, "a"}, // prefixes match by element
			{"GET", "match.example", "/q?v=c", nil, 200, "c"},
			{"GET", "match.example", "/q?v=d", nil, 200, "a"},
			{"GET", "other.example", "/", nil, 404, ""},
			{"GET", "broken.example", "/x", nil, 500, ""},
		} {
			resp, body := get(c.method, c.host, c.path, c.hdr)
			if resp.StatusCode != c.code || (c.body != "" && body != c.body) {
				t.Errorf("%s %s%s %v: %d %q, want %d %q", c.method, c.host, c.path, c.hdr, resp.StatusCode, body, c.code, c.body)
			}
		}
	})

	// The Host header reaches the backend as sent, port included
	// (conformance HTTPRouteHostnameIntersection found nginx's $host
	// dropping it).
	t.Run("HostHeaderKept", func(t *testing.T) {
		resp, _ := get("GET", "match.example", "/x", map[string]string{"X-Pick": "b"})
		if got, want := resp.Header.Get("X-Seen-Host"), fmt.Sprintf("match.example:%d", httpPort); got != want {
			t.Errorf("Host at the backend %q, want %q", got, want)
		}
	})

	t.Run("Weights", func(t *testing.T) {
		const n = 4000
		count := map[string]int{}
		for i := 0; i < n; i++ {
			resp, body := get("GET", "split.example", "/", nil)
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
			}
			count[body]++
		}
		a, b := 100*float64(count["a"])/n, 100*float64(count["b"])/n
		t.Logf("weights 80/20/0 over %d requests on fresh connections: a %.2f%%, b %.2f%%, c %d requests", n, a, b, count["c"])
		if a < 78 || a > 82 || b < 18 || b > 22 || count["c"] != 0 {
			t.Errorf("shares %v, want a 80 and b 20 within 2 points, c none", count)
		}
	})

	t.Run("Filters", func(t *testing.T) {
		resp, _ := get("GET", "filters.example", "/old/page?x=1", nil)
		if loc := resp.Header.Get("Location"); resp.StatusCode != 301 || loc != "https://new.example/new/page?x=1" {
			t.Errorf("redirect: %d %q, want 301 https://new.example/new/page?x=1", resp.StatusCode, loc)
		}
		for _, code := range []int{303, 307, 308} {
			resp, _ := get("GET", "filters.example", fmt.Sprintf("/c%d", code), nil)
			if loc := resp.Header.Get("Location"); resp.StatusCode != code || loc != fmt.Sprintf("https://new.example/c%d", code) {
				t.Errorf("redirect: %d %q, want %d https://new.example/c%d", resp.StatusCode, loc, code, code)
			}
		}
		resp, body := get("GET", "filters.example", "/v1/items?y=2", map[string]string{"X-Drop": "secret"})
		if resp.StatusCode != 200 || body != "a" {
			t.Fatalf("rewrite: %d %q", resp.StatusCode, body)
		}
		for k, want := range map[string]string{"X-Served-By": "steelyard", "X-Seen-X-Env": "prod west", "X-Seen-X-Drop": "", "X-Seen-Path": "/v2/items?y=2"} {
			if got := resp.Header.Get(k); got != want {
				t.Errorf("%s: %q, want %q", k, got, want)
			}
		}
	})

	t.Run("BadRouteIsolated", func(t *testing.T) {
		resp, body := get("GET", "bad.example", "/", map[string]string{"X-A": "a"})
		if resp.StatusCode != 404 || strings.Contains(body, "pwned") {
			t.Errorf("bad route: %d %q, want 404", resp.StatusCode, body)
		}
		conf, err := w.Conf()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(conf, "pwned") || strings.Contains(conf, "bad.example") {
			t.Error("the bad route reached nginx.conf")
		}
		if resp, body := get("GET", "match.example", "/x", map[string]string{"X-Pick": "b"}); resp.StatusCode != 200 || body != "b" {
			t.Errorf("good route after the bad one: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("TLS", func(t *testing.T) {
		dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
			var c net.Conn
			err := w.Client.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, fmt.Sprintf("%s:%d", gatewayAddr, httpsPort))
				return err
			})
			return c, err
		}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "split.example"}}}
		resp, err := c.Get(fmt.Sprintf("https://split.example:%d/", httpsPort))
		if err != nil {
			t.Fatalf("HTTPS through the listener's certificate: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "split.example" {
			t.Errorf("HTTPS: %d %+v", resp.StatusCode, resp.TLS)
		}
		// A name no route covers, on a listener without a hostname: the
		// listener's certificate, then 404 (conformance
		// HTTPRouteHTTPSListener found the handshake refused).
		u := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true,
			TLSClientConfig: &tls.Config{ServerName: "unknown.example", InsecureSkipVerify: true}}} // the name is not the certificate's
		resp, err = u.Get(fmt.Sprintf("https://unknown.example:%d/", httpsPort))
		if err != nil {
			t.Fatalf("HTTPS to a name no route covers: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 || resp.TLS.PeerCertificates[0].Subject.CommonName != "split.example" {
			t.Errorf("HTTPS to a name no route covers: %d, certificate %q; want 404 with the listener's", resp.StatusCode, resp.TLS.PeerCertificates[0].Subject.CommonName)
		}
	})

	// verify expects the listeners' forwards to nginx too (--gateway-http).
	t.Run("Verify", func(t *testing.T) {
		sandbox.Poll(t, 10*time.Second, 100*time.Millisecond, "verify --gateway --gateway-http", func() (bool, string) {
			o, e, err := w.SB.Node.Exec2(steelyardBin, "verify", "--kubeconfig", cp.Kubeconfig, "--mode", mode, "--node-name", harness.NodeName,
				"--gateway", "--gateway-http")
			return err == nil, o + e
		})
	})

	t.Run("ReloadsOnlyOnTextChange", func(t *testing.T) {
		const reloads = "steelyard_ingress_nginx_reloads_total"
		r0, err := w.Metric(reloads)
		if err != nil {
			t.Fatal(err)
		}
		// Endpoint churn behind a VIP: the kernel changes (an L4 sync),
		// nginx does not. (Which pod answers cannot show it: nginx keeps
		// its upstream connections to the VIP alive.)
		for _, pods := range [][]string{{"a", "c"}, {"a"}} {
			synced := strings.Count(w.Agent.Log(), "msg=synced")
			if err := w.SetEndpoints(ctx, "s-a", pods...); err != nil {
				t.Fatal(err)
			}
			sandbox.Poll(t, 15*time.Second, 50*time.Millisecond, "the L4 sync of the endpoint change", func() (bool, string) {
				return strings.Count(w.Agent.Log(), "msg=synced") > synced, "no new synced line"
			})
		}
		time.Sleep(time.Second)
		if r1, _ := w.Metric(reloads); r1 != r0 {
			t.Errorf("endpoint churn reloaded nginx: %v -> %v reloads", r0, r1)
		}
		// A route change changes the text: one reload.
		r, err := gc.GatewayV1().HTTPRoutes(harness.Namespace).Get(ctx, "split", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r.Spec.Rules[0].BackendRefs[1].Weight = ptr.To[int32](80)
		if _, err := gc.GatewayV1().HTTPRoutes(harness.Namespace).Update(ctx, r, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		sandbox.Poll(t, 15*time.Second, 50*time.Millisecond, "a reload for the weight change", func() (bool, string) {
			r2, _ := w.Metric(reloads)
			return r2 >= r0+1, fmt.Sprint(r2)
		})
		if r2, _ := w.Metric(reloads); r2 != r0+1 {
			t.Errorf("a weight change: %v reloads, want %v", r2, r0+1)
		}
	})
}

// gatewayAddr is the Web Gateway's address: not one of the node's, so
// requests reach nginx only through the dataplane's forward of the
// listener (the conformance suite found they did not, when nginx listened
// on the listener port of the node's own addresses only).
var gatewayAddr = netip.MustParseAddr("198.18.0.200")

// gatewayClient sends every request from the client namespace to the
// Gateway address's HTTP listener port, whatever the URL's host; fresh
// connection per request, redirects returned, not followed.
func gatewayClient(w *harness.World) *http.Client {
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var c net.Conn
		err := w.Client.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, fmt.Sprintf("%s:%d", gatewayAddr, httpPort))
			return err
		})
		return c, err
	}
	return &http.Client{
		Transport:     &http.Transport{DialContext: dial, DisableKeepAlives: true},
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
