package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// Test IP plan: Service VIPs 198.18.0.0/16, pods 198.19.1.0/24.

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var (
	exact  = ptr.To(networkingv1.PathTypeExact)
	prefix = ptr.To(networkingv1.PathTypePrefix)
	implSp = ptr.To(networkingv1.PathTypeImplementationSpecific)
)

const testDir = "/run/steelyard/nginx"

func makeService(ns, name, vip string, ports ...corev1.ServicePort) *corev1.Service {
	if len(ports) == 0 {
		ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: vip, Ports: ports},
	}
}

func svcBackend(name string, port int32) networkingv1.IngressBackend {
	return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: name, Port: networkingv1.ServiceBackendPort{Number: port}}}
}

type pathSpec struct {
	path string
	typ  *networkingv1.PathType
	svc  string
}

func makeIngress(ns, name string, age int, f func(*networkingv1.Ingress)) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name,
		CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, age, 0, time.UTC)),
	}}
	if f != nil {
		f(ing)
	}
	return ing
}

func rule(host string, paths ...pathSpec) networkingv1.IngressRule {
	r := networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
	for _, p := range paths {
		r.HTTP.Paths = append(r.HTTP.Paths, networkingv1.HTTPIngressPath{Path: p.path, PathType: p.typ, Backend: svcBackend(p.svc, 80)})
	}
	return r
}

func services(svcs ...*corev1.Service) map[string]*corev1.Service {
	m := map[string]*corev1.Service{}
	for _, s := range svcs {
		m[s.Namespace+"/"+s.Name] = s
	}
	return m
}

// selfSigned returns a PEM certificate and key for hosts.
func selfSigned(t testing.TB, hosts ...string) (crt, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func tlsSecret(ns, name string, crt, key []byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}
}

// goldenInput is the fixture of the golden test: two hosts, a wildcard, a
// catch-all rule, TLS, a default backend, a missing Service.
func goldenInput() Input {
	return Input{
		Services: services(
			makeService("shop", "web", "198.18.0.10"),
			makeService("shop", "api", "198.18.0.11"),
			makeService("shop", "static", "198.18.0.12"),
			makeService("shop", "fallback", "198.18.0.13"),
		),
		Ingresses: []*networkingv1.Ingress{
			makeIngress("shop", "main", 1, func(i *networkingv1.Ingress) {
				i.Spec.DefaultBackend = ptr.To(svcBackend("fallback", 80))
				i.Spec.Rules = []networkingv1.IngressRule{
					rule("shop.example", pathSpec{"/", prefix, "web"}, pathSpec{"/api/", prefix, "api"}, pathSpec{"/healthz", exact, "api"}),
					rule("*.cdn.example", pathSpec{"/static", implSp, "static"}),
				}
			}),
			makeIngress("shop", "extra", 2, func(i *networkingv1.Ingress) {
				i.Spec.Rules = []networkingv1.IngressRule{
					rule("shop.example", pathSpec{"/api/v2", prefix, "web"}, pathSpec{"/gone", prefix, "missing"}),
					rule("", pathSpec{"/ping", exact, "api"}),
				}
			}),
		},
		Settings: DefaultSettings(),
	}
}

func TestRenderGolden(t *testing.T) {
	out := Render(goldenInput(), Options{Dir: testDir})
	checkGolden(t, "basic.conf.golden", out.Text)
	var probs []string
	for _, p := range out.Problems {
		probs = append(probs, p.String())
	}
	want := []string{`Ingress shop/extra: BackendNotFound: Service shop/missing not found; its paths answer 503`}
	if strings.Join(probs, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(probs, "\n"), strings.Join(want, "\n"))
	}
	// Rendering is deterministic: same input, same text (no reload).
	for range 5 {
		if again := Render(goldenInput(), Options{Dir: testDir}); again.Text != out.Text {
			t.Fatal("rendering the same input twice gave different text")
		}
	}
	nginxTest(t, out)
}

func TestRenderPodsMode(t *testing.T) {
	in := goldenInput()
	in.Ingresses = in.Ingresses[:1]
	ready := discoveryv1.EndpointConditions{Ready: ptr.To(true)}
	in.Slices = []*discoveryv1.EndpointSlice{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.19.1.3"}, Conditions: ready},
			{Addresses: []string{"198.19.1.2"}, Conditions: ready},
			{Addresses: []string{"198.19.1.4"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
	}}
	out := Render(in, Options{Dir: testDir, Upstreams: UpstreamsPods})
	if !strings.Contains(out.Text, "upstream shop_web_80 {\n        server 198.19.1.2:8080;\n        server 198.19.1.3:8080;\n        keepalive 64;\n    }") {
		t.Errorf("pods upstream not as expected:\n%s", out.Text)
	}
	// api has no slices: its paths answer 503 and it is reported.
	found := false
	for _, p := range out.Problems {
		found = found || (p.Reason == ReasonNoBackend && strings.Contains(p.Message, "shop/api has no ready endpoints"))
	}
	if !found {
		t.Errorf("missing endpoints not reported: %v", out.Problems)
	}
	nginxTest(t, out)
}

// TestPathSemantics checks the Ingress spec's path-matching examples
// against the locations Render writes, matched with nginx's documented
// algorithm (an "=" location first, then the longest prefix; Render
// writes no regex location). test/ingress checks the same table with a
// real nginx.
func TestPathSemantics(t *testing.T) {
	type path struct {
		p   string
		typ *networkingv1.PathType
	}
	for _, tc := range []struct {
		paths []path
		req   string
		want  string // the path that serves it, "" for none (404)
	}{
		{[]path{{"/", prefix}}, "/anything/at/all", "/"},
		{[]path{{"/foo", exact}}, "/foo", "/foo"},
		{[]path{{"/foo", exact}}, "/bar", ""},
		{[]path{{"/foo", exact}}, "/foo/", ""},
		{[]path{{"/foo/", exact}}, "/foo", ""},
		{[]path{{"/", prefix}, {"/foo/", exact}}, "/foo", "/"},
		{[]path{{"/", prefix}, {"/foo/", exact}}, "/foo/", "/foo/"},
		{[]path{{"/foo", prefix}}, "/foo", "/foo"},
		{[]path{{"/foo", prefix}}, "/foo/", "/foo"},
		{[]path{{"/foo/", prefix}}, "/foo", "/foo/"},
		{[]path{{"/foo/", prefix}}, "/foo/", "/foo/"},
		{[]path{{"/aaa/bb", prefix}}, "/aaa/bbb", ""},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb", "/aaa/bbb"},
		{[]path{{"/aaa/bbb/", prefix}}, "/aaa/bbb", "/aaa/bbb/"},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb/", "/aaa/bbb"},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb/ccc", "/aaa/bbb"},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbbxyz", ""},
		{[]path{{"/", prefix}, {"/aaa", prefix}}, "/aaa/ccc", "/aaa"},
		{[]path{{"/", prefix}, {"/aaa", prefix}, {"/aaa/bbb", prefix}}, "/aaa/bbb", "/aaa/bbb"},
		{[]path{{"/", prefix}, {"/aaa", prefix}, {"/aaa/bbb", prefix}}, "/ccc", "/"},
		{[]path{{"/aaa", prefix}}, "/ccc", ""},
		{[]path{{"/foo", prefix}, {"/foo", exact}}, "/foo", "/foo exact"},
		{[]path{{"/foo", exact}, {"/foo", prefix}}, "/foo", "/foo exact"},
		{[]path{{"/foo", exact}, {"/foo", prefix}}, "/foo/x", "/foo"},
		{[]path{{"/foo", implSp}}, "/foo/bar", "/foo"},
		{[]path{{"/foo", implSp}}, "/foobar", ""},
	} {
		// One Service per path, named after it, in one Ingress per path:
		// the longest match must win across Ingresses.
		in := Input{Services: map[string]*corev1.Service{}, Settings: DefaultSettings()}
		names := map[string]string{}
		for i, p := range tc.paths {
			svc := "s" + strconv.Itoa(i)
			in.Services["t/"+svc] = makeService("t", svc, "198.18.0."+strconv.Itoa(10+i))
			desc := p.p
			if p.typ == exact && len(tc.paths) > 1 && tc.paths[0].p == tc.paths[1].p {
				desc += " exact"
			}
			names["t_"+svc+"_80"] = desc
			in.Ingresses = append(in.Ingresses, makeIngress("t", "i"+strconv.Itoa(i), i, func(ing *networkingv1.Ingress) {
				ing.Spec.Rules = []networkingv1.IngressRule{rule("h.example", pathSpec{p.p, p.typ, svc})}
			}))
		}
		out := Render(in, Options{Dir: testDir})
		got := names[matchLocation(t, out.Text, "h.example", tc.req)]
		if got != tc.want {
			t.Errorf("paths %v, request %s: served by %q, want %q\n%s", tc.paths, tc.req, got, tc.want, out.Text)
		}
	}
}

var (
	serverNameRE = regexp.MustCompile(`^\s*server_name "?([^";]+)"?;`)
	locationRE   = regexp.MustCompile(`^\s*location (?:(=|\^~) )?"([^"]*)" \{`)
	targetRE     = regexp.MustCompile(`^\s*(?:proxy_pass http://([^;]+)|return (\d+));`)
)

// matchLocation finds the location of server host that nginx would pick
// for path, and returns its upstream (or "return N").
func matchLocation(t *testing.T, conf, host, path string) string {
	t.Helper()
	type loc struct{ match, path, target string }
	var locs []loc
	in := false
	var cur *loc
	for _, line := range strings.Split(conf, "\n") {
		if m := serverNameRE.FindStringSubmatch(line); m != nil {
			in = m[1] == host
		}
		if !in {
			continue
		}
		if m := locationRE.FindStringSubmatch(line); m != nil {
			locs = append(locs, loc{match: m[1], path: m[2]})
			cur = &locs[len(locs)-1]
		}
		if m := targetRE.FindStringSubmatch(line); m != nil && cur != nil {
			if m[1] != "" {
				cur.target = m[1]
			} else {
				cur.target = "return " + m[2]
			}
		}
	}
	for _, l := range locs {
		if l.match == "=" && l.path == path {
			return l.target
		}
	}
	best := loc{}
	for _, l := range locs {
		if l.match != "=" && strings.HasPrefix(path, l.path) && len(l.path) > len(best.path) {
			best = l
		}
	}
	return best.target
}

// TestInjection feeds values that would add a directive if they reached
// nginx.conf: the Ingress carrying one is skipped with a reported problem,
// the payload appears nowhere in the text, and the other Ingress is still
// served.
func TestInjection(t *testing.T) {
	payloads := []string{
		"/x;return 200 pwned;", "/x{", "/x}", "/x\nreturn 200 pwned;", "/x$host", `/x"`, "/x'", "/x y", "/x#", `/x\`, "/%3b",
	}
	hosts := []string{"a.example;return", "a.example{", "a}.example", "a.example\nlisten 81", "$host", `a"b.example`, "a'b.example", "a b.example", "A.Example"}
	good := makeIngress("ok", "good", 0, func(i *networkingv1.Ingress) {
		i.Spec.Rules = []networkingv1.IngressRule{rule("good.example", pathSpec{"/", prefix, "web"})}
	})
	svcs := services(makeService("ok", "web", "198.18.0.20"), makeService("evil", "web", "198.18.0.21"))
	var cases []*networkingv1.Ingress
	for _, p := range payloads {
		cases = append(cases, makeIngress("evil", "path", 1, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{p, prefix, "web"})}
		}))
	}
	for _, h := range hosts {
		cases = append(cases, makeIngress("evil", "host", 1, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{rule(h, pathSpec{"/", prefix, "web"})}
		}), makeIngress("evil", "tlshost", 1, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, "web"})}
			i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{h}, SecretName: "s"}}
		}))
	}
	for _, bad := range []string{"web;", "web\n", "we{b", "$web"} {
		cases = append(cases,
			makeIngress("evil", "svc", 1, func(i *networkingv1.Ingress) {
				i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, bad})}
			}),
			makeIngress("evil", "port", 1, func(i *networkingv1.Ingress) {
				i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, "web"})}
				i.Spec.Rules[0].HTTP.Paths[0].Backend.Service.Port = networkingv1.ServiceBackendPort{Name: bad}
			}),
			makeIngress("evil;", "ns", 1, func(i *networkingv1.Ingress) {
				i.Namespace = "evil" + bad
				i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, "web"})}
			}),
			makeIngress("evil", "secret", 1, func(i *networkingv1.Ingress) {
				i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, "web"})}
				i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"evil.example"}, SecretName: bad}}
			}),
			makeIngress("evil", "name"+bad, 1, func(i *networkingv1.Ingress) {
				i.Spec.Rules = []networkingv1.IngressRule{rule("evil.example", pathSpec{"/", prefix, "web"})}
			}),
		)
	}
	base := Render(Input{Ingresses: []*networkingv1.Ingress{good}, Services: svcs, Settings: DefaultSettings()}, Options{Dir: testDir})
	for _, evil := range cases {
		out := Render(Input{Ingresses: []*networkingv1.Ingress{good, evil}, Services: svcs, Settings: DefaultSettings()}, Options{Dir: testDir})
		if out.Text != base.Text {
			t.Errorf("Ingress %s/%s %+v changed the config:\n%s", evil.Namespace, evil.Name, evil.Spec, out.Text)
		}
		if len(out.Problems) != 1 || out.Problems[0].Reason != ReasonInvalidIngress {
			t.Errorf("Ingress %s/%s: problems %v, want one %s", evil.Namespace, evil.Name, out.Problems, ReasonInvalidIngress)
		}
		for _, s := range []string{"pwned", "listen 81", "evil"} {
			if strings.Contains(out.Text, s) {
				t.Errorf("%q reached nginx.conf", s)
			}
		}
	}
	// Annotations never reach the config: the same Ingress with hostile
	// annotations renders the same text.
	annotated := good.DeepCopy()
	annotated.Annotations = map[string]string{
		"nginx.ingress.kubernetes.io/configuration-snippet": "return 200 pwned;",
		"nginx.ingress.kubernetes.io/server-snippet":        "}\nserver { listen 81; }",
		"steelyard.io/anything":                             "$host;{}\"'\n",
	}
	if out := Render(Input{Ingresses: []*networkingv1.Ingress{annotated}, Services: svcs, Settings: DefaultSettings()}, Options{Dir: testDir}); out.Text != base.Text {
		t.Errorf("annotations changed the config:\n%s", out.Text)
	}
	nginxTest(t, base)
}

func TestSettings(t *testing.T) {
	s, errs := ParseSettings(map[string]string{
		"worker-processes":               "2",
		"worker-connections":             "1024",
		"upstream-keepalive-connections": "8",
		"keepalive-timeout":              "30s",
		"proxy-read-timeout":             "5m",
	})
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	want := DefaultSettings()
	want.WorkerProcesses, want.WorkerConnections, want.UpstreamKeepalive, want.KeepaliveTimeout, want.ProxyReadTimeout = "2", 1024, 8, "30s", "5m"
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	hostile := map[string]string{
		"worker-processes":               "1; user root",
		"worker-connections":             "1024;\n}",
		"upstream-keepalive-connections": "{",
		"keepalive-timeout":              "30s; return 200 pwned",
		"proxy-connect-timeout":          "$x",
		"proxy-read-timeout":             `"5s"`,
		"proxy-send-timeout":             "5s\nlisten 81;",
		"server-snippet":                 "listen 81;",
		"worker-processes-x":             "2",
	}
	s, errs = ParseSettings(hostile)
	if s != DefaultSettings() {
		t.Errorf("hostile values changed settings: %+v", s)
	}
	if len(errs) != len(hostile) {
		t.Errorf("got %d errors, want %d (one per key): %v", len(errs), len(hostile), errs)
	}
	for _, e := range errs {
		t.Log(e)
	}
	in := goldenInput()
	in.Settings = s
	out := Render(in, Options{Dir: testDir})
	for _, v := range []string{"pwned", "user root", "listen 81", "$x", `"5s"`, "1024;"} {
		if strings.Contains(out.Text, v) {
			t.Errorf("%q reached nginx.conf", v)
		}
	}
}

func TestTLS(t *testing.T) {
	crt, key := selfSigned(t, "secure.example")
	in := Input{
		Services: services(makeService("s", "web", "198.18.0.30")),
		Secrets: map[string]*corev1.Secret{
			"s/good":    tlsSecret("s", "good", crt, key),
			"s/garbage": tlsSecret("s", "garbage", []byte("not a certificate"), key),
		},
		Ingresses: []*networkingv1.Ingress{makeIngress("s", "tls", 0, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{
				rule("secure.example", pathSpec{"/", prefix, "web"}),
				rule("broken.example", pathSpec{"/", prefix, "web"}),
				rule("absent.example", pathSpec{"/", prefix, "web"}),
			}
			i.Spec.TLS = []networkingv1.IngressTLS{
				{Hosts: []string{"secure.example"}, SecretName: "good"},
				{Hosts: []string{"broken.example"}, SecretName: "garbage"},
				{Hosts: []string{"absent.example"}, SecretName: "nope"},
			}
		})},
		Settings: DefaultSettings(),
	}
	out := Render(in, Options{Dir: testDir})
	if len(out.Certs) != 1 {
		t.Fatalf("got %d certificate files, want 1", len(out.Certs))
	}
	var reasons []string
	for _, p := range out.Problems {
		reasons = append(reasons, p.Reason+": "+p.Message)
	}
	sort.Strings(reasons)
	if len(reasons) != 2 || !strings.Contains(reasons[0], "s/garbage") || !strings.Contains(reasons[1], "s/nope not found") {
		t.Errorf("problems: %v", reasons)
	}
	if strings.Count(out.Text, "ssl_certificate ") != 1 || !strings.Contains(out.Text, "ssl_reject_handshake on;") {
		t.Errorf("want one TLS server and a catch-all that rejects unknown SNI:\n%s", out.Text)
	}
	nginxTest(t, out)
}

func TestConflicts(t *testing.T) {
	svcs := services(makeService("a", "one", "198.18.0.40"), makeService("a", "two", "198.18.0.41"))
	older := makeIngress("a", "older", 1, func(i *networkingv1.Ingress) {
		i.Spec.Rules = []networkingv1.IngressRule{rule("c.example", pathSpec{"/x", prefix, "one"})}
		i.Spec.DefaultBackend = ptr.To(svcBackend("one", 80))
	})
	newer := makeIngress("a", "newer", 2, func(i *networkingv1.Ingress) {
		i.Spec.Rules = []networkingv1.IngressRule{rule("c.example", pathSpec{"/x", prefix, "two"}, pathSpec{"/y", prefix, "two"})}
		i.Spec.DefaultBackend = ptr.To(svcBackend("two", 80))
	})
	// Order of the input does not matter: the older one wins.
	for _, ings := range [][]*networkingv1.Ingress{{older, newer}, {newer, older}} {
		out := Render(Input{Ingresses: ings, Services: svcs, Settings: DefaultSettings()}, Options{Dir: testDir})
		if got := matchLocation(t, out.Text, "c.example", "/x/1"); got != "a_one_80" {
			t.Errorf("/x/1 served by %s, want a_one_80 (older Ingress)", got)
		}
		if got := matchLocation(t, out.Text, "c.example", "/y"); got != "a_two_80" {
			t.Errorf("/y served by %s, want a_two_80", got)
		}
		if got := matchLocation(t, out.Text, "_", "/other"); got != "a_one_80" {
			t.Errorf("default backend %s, want a_one_80", got)
		}
		n := 0
		for _, p := range out.Problems {
			if p.Reason == ReasonPathConflict && p.Name == "newer" {
				n++
			}
		}
		if n != 2 {
			t.Errorf("want 2 conflicts reported on a/newer, got %v", out.Problems)
		}
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("rendered text differs from %s (go test -update rewrites it):\n%s", path, got)
	}
}

// nginxTest runs `nginx -t` on a rendered config when nginx is installed
// (scripts/install-deps.sh installs it; CI has it).
func nginxTest(t *testing.T, out Output) {
	t.Helper()
	bin := nginxBinary()
	if bin == "" {
		t.Log("nginx not installed: nginx -t not run")
		return
	}
	dir := t.TempDir()
	text := strings.ReplaceAll(out.Text, testDir, dir)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range out.Certs {
		if err := os.WriteFile(filepath.Join(dir, "certs", name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	prefix, extra, ok := privateNetns(t)
	if !ok {
		return
	}
	argv := append(append(append(prefix, bin), extra...), "-t", "-q", "-p", dir+"/", "-e", "stderr", "-c", conf)
	if b, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Errorf("nginx -t: %v\n%s\n%s", err, b, text)
	}
}

// privateNetns returns the command prefix that runs nginx -t in a network
// namespace of its own (nginx -t binds the listening ports, and unit tests
// must not touch the machine's network namespace), and extra nginx
// arguments. As root: unshare -n. As another user: a user namespace too,
// where nginx believes it is root, so "user root" keeps the owner of its
// temporary folders mappable. ok is false (and logged) when namespaces are
// not available.
func privateNetns(t testing.TB) (prefix, extra []string, ok bool) {
	t.Helper()
	if os.Geteuid() == 0 {
		prefix = []string{"unshare", "-n"}
	} else {
		prefix, extra = []string{"unshare", "-rn"}, []string{"-g", "user root;"}
	}
	if err := exec.Command(prefix[0], append(prefix[1:], "true")...).Run(); err != nil {
		t.Logf("nginx -t not run: cannot create a network namespace (%s): %v", strings.Join(prefix, " "), err)
		return nil, nil, false
	}
	return prefix, extra, true
}

func nginxBinary() string {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx"
	}
	return ""
}

// TestExampleIngress renders examples/ingress/web.yaml against the demo's
// Services: valid, no problem but the missing TLS Secret, nginx -t clean.
func TestExampleIngress(t *testing.T) {
	b, err := os.ReadFile("../../examples/ingress/web.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ing networkingv1.Ingress
	if err := yaml.UnmarshalStrict(b, &ing); err != nil {
		t.Fatal(err)
	}
	in := Input{
		Ingresses: []*networkingv1.Ingress{&ing},
		Services:  services(makeService("demo", "web", "198.18.0.10"), makeService("demo", "shop", "198.18.0.12")),
		Settings:  DefaultSettings(),
	}
	out := Render(in, Options{Dir: testDir})
	if len(out.Problems) != 1 || out.Problems[0].Reason != ReasonInvalidTLS {
		t.Errorf("problems: %v, want only the missing Secret", out.Problems)
	}
	if got := matchLocation(t, out.Text, "shop.example", "/api/v1"); got != "demo_web_80" {
		t.Errorf("/api/v1 -> %s", got)
	}
	if got := matchLocation(t, out.Text, "shop.example", "/apix"); got != "demo_shop_80" {
		t.Errorf("/apix -> %s", got)
	}
	nginxTest(t, out)
}
