package ingress

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

func pathMatch(typ gwv1.PathMatchType, v string) *gwv1.HTTPPathMatch {
	return &gwv1.HTTPPathMatch{Type: ptr.To(typ), Value: ptr.To(v)}
}

func httpRoute(name string, age int, hosts []gwv1.Hostname, rules ...gwv1.HTTPRouteRule) *gwv1.HTTPRoute {
	return &gwv1.HTTPRoute{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+age), 0))},
		Spec:       gwv1.HTTPRouteSpec{Hostnames: hosts, Rules: rules},
	}
}

func vipBackend(ip string, w int32) HTTPBackend {
	return HTTPBackend{Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), 80), Weight: w}
}

// httpGoldenInput: a weighted route with matches and header filters on a
// hostname, a redirect and a rewrite route on any host, a route whose
// backends are all invalid, and one partly invalid.
func httpGoldenInput() Input {
	weighted := httpRoute("weighted", 0, []gwv1.Hostname{"app.example.com"},
		gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/api/"), Method: ptr.To(gwv1.HTTPMethodGet),
				Headers: []gwv1.HTTPHeaderMatch{{Name: "X-Version", Value: "v2"}}, QueryParams: []gwv1.HTTPQueryParamMatch{{Name: "debug", Value: "1"}}}},
			Filters: []gwv1.HTTPRouteFilter{
				{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
					Set: []gwv1.HTTPHeader{{Name: "X-Env", Value: "prod west"}}, Add: []gwv1.HTTPHeader{{Name: "X-Trace", Value: "sy"}}, Remove: []string{"X-Drop"}}},
				{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{
					Set: []gwv1.HTTPHeader{{Name: "Cache-Control", Value: "no-store"}}, Remove: []string{"Server"}}},
			},
		},
		gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchExact, "/health")}}},
		gwv1.HTTPRouteRule{},
	)
	redirect := httpRoute("redirect", 1, nil,
		gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/old")}},
			Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
				Scheme: ptr.To("https"), Hostname: ptr.To(gwv1.PreciseHostname("new.example.com")), StatusCode: ptr.To(301),
				Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/new")}}}},
		},
		gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/v1")}},
			Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{
				Hostname: ptr.To(gwv1.PreciseHostname("internal.example.com")),
				Path:     &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To("/v2")}}}},
		},
		gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchExact, "/moved")}},
			Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
				Port: ptr.To(gwv1.PortNumber(8443))}}},
		},
	)
	broken := httpRoute("broken", 2, []gwv1.Hostname{"*.example.com"},
		gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/all-invalid")}}},
		gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/half")}}},
	)
	return Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{
		{Route: weighted, Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{"app.example.com"}, Listener: "web"}},
			Backends: [][]HTTPBackend{
				{vipBackend("198.18.0.10", 80), vipBackend("198.18.0.11", 20), vipBackend("198.18.0.12", 0)},
				{vipBackend("198.18.0.10", 1)},
				{vipBackend("198.18.0.11", 1)},
			}},
		{Route: redirect, Attach: []HTTPAttachment{{Port: 8080, Listener: "web"}},
			Backends: [][]HTTPBackend{nil, {vipBackend("198.18.0.12", 1)}, nil}},
		{Route: broken, Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{"*.example.com"}, Listener: "web"}},
			Backends: [][]HTTPBackend{
				{{Invalid: true, Weight: 1}},
				{vipBackend("198.18.0.10", 1), {Invalid: true, Weight: 1}},
			}},
	}}
}

func TestHTTPRouteGolden(t *testing.T) {
	out := Render(httpGoldenInput(), Options{Dir: testDir})
	if len(out.Problems) != 0 {
		t.Errorf("problems: %v", out.Problems)
	}
	checkGolden(t, "httproute.conf.golden", out.Text)
	nginxTest(t, out)
	if again := Render(httpGoldenInput(), Options{Dir: testDir}); again.Text != out.Text {
		t.Error("rendering is not deterministic")
	}
}

// dispatch returns, for the location `match path` of the server of host
// on the rendered text, the internal targets in the order nginx tries them.
func dispatch(t *testing.T, text, host, match, path string) []string {
	t.Helper()
	i := strings.Index(text, "server_name \""+host+"\";")
	if host == "_" {
		i = strings.Index(text, "listen 8080 default_server;")
	}
	if i < 0 {
		t.Fatalf("no server %s", host)
	}
	srv := text[i:]
	if j := strings.Index(srv, "\n    }\n"); j >= 0 {
		srv = srv[:j]
	}
	head := "location " + match + " \"" + path + "\" {"
	if match == "" {
		head = "location \"" + path + "\" {"
	}
	k := strings.Index(srv, head)
	if k < 0 {
		t.Fatalf("server %s has no %s:\n%s", host, head, srv)
	}
	body := srv[k:]
	body = body[:strings.Index(body, "return 404;")]
	var out []string
	for _, m := range regexp.MustCompile(`"/\.steelyard/([0-9-]+)\$uri"`).FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestHTTPRoutePrecedence checks the order of the spec's precedence rules
// on the rendered locations. The expected orders are written by hand from
// the spec's list (ids are route-rule-match, routes oldest first).
func TestHTTPRoutePrecedence(t *testing.T) {
	m := func(p *gwv1.HTTPPathMatch, method string, headers, query int) gwv1.HTTPRouteMatch {
		x := gwv1.HTTPRouteMatch{Path: p}
		if method != "" {
			x.Method = ptr.To(gwv1.HTTPMethod(method))
		}
		for i := 0; i < headers; i++ {
			x.Headers = append(x.Headers, gwv1.HTTPHeaderMatch{Name: gwv1.HTTPHeaderName("h" + string(rune('a'+i))), Value: "1"})
		}
		for i := 0; i < query; i++ {
			x.QueryParams = append(x.QueryParams, gwv1.HTTPQueryParamMatch{Name: gwv1.HTTPHeaderName("q" + string(rune('a'+i))), Value: "1"})
		}
		return x
	}
	older := httpRoute("b-older", 0, nil, gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "", 0, 0),     // 0-0-0
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "", 0, 2),     // 0-0-1
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "", 1, 0),     // 0-0-2
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "POST", 0, 0), // 0-0-3
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a/b"), "", 1, 0),   // 0-0-4
		m(pathMatch(gwv1.PathMatchExact, "/a/b"), "", 0, 1),        // 0-0-5
		m(pathMatch(gwv1.PathMatchPathPrefix, "/"), "", 0, 0),      // 0-0-6
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "POST", 2, 0), // 0-0-7
	}})
	newer := httpRoute("a-newer", 5, nil, gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{
		m(pathMatch(gwv1.PathMatchPathPrefix, "/a"), "", 1, 0), // 1-0-0: ties 0-0-2, newer
	}})
	host := httpRoute("c-host", 9, []gwv1.Hostname{"h.example.com"}, gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{
		m(pathMatch(gwv1.PathMatchPathPrefix, "/"), "", 0, 0), // 2-0-0: a longer hostname beats every path
	}})
	be := [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}
	in := Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{
		{Route: newer, Attach: []HTTPAttachment{{Port: 8080}}, Backends: be},
		{Route: older, Attach: []HTTPAttachment{{Port: 8080}}, Backends: be},
		{Route: host, Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{"h.example.com"}}}, Backends: be},
	}}
	out := Render(in, Options{Dir: testDir})
	nginxTest(t, out)
	cases := []struct {
		host, match, path string
		want              []string
	}{
		// Exact /a/b: Exact, longest prefix, then /a by method (most
		// headers first), headers, query, plain, then /.
		{"_", "=", "/a/b", []string{"0-0-5", "0-0-4", "0-0-7", "0-0-3", "0-0-2", "1-0-0", "0-0-1", "0-0-0"}},
		{"_", "^~", "/a/", []string{"0-0-7", "0-0-3", "0-0-2", "1-0-0", "0-0-1", "0-0-0"}},
		{"_", "^~", "/a/b/", []string{"0-0-4", "0-0-7", "0-0-3", "0-0-2", "1-0-0", "0-0-1", "0-0-0"}},
		{"_", "", "/", []string{"0-0-6"}},
		{"h.example.com", "=", "/a/b", []string{"2-0-0"}},
	}
	for _, c := range cases {
		got := dispatch(t, out.Text, c.host, c.match, c.path)
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s %s %s: order %v, want %v", c.host, c.match, c.path, got, c.want)
		}
	}
}

// TestHTTPRouteInjection: values that could end a string or a directive
// are refused with a Problem, the other routes are still rendered, and
// nothing of the bad values reaches the text.
func TestHTTPRouteInjection(t *testing.T) {
	bad := []struct {
		name string
		rule gwv1.HTTPRouteRule
	}{
		{"path-quote", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, `/x";return 200 "pwned`)}}}},
		{"path-brace", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/x{}")}}}},
		{"path-internal", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/.steelyard/0-0-0")}}}},
		{"path-regex", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchRegularExpression, "/pwned.*")}}}},
		{"header-value", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A", Value: "a\"; pwned"}}}}}},
		{"header-dollar", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A", Value: "$pwned"}}}}}},
		{"header-bracket", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A", Value: "[^pwned]"}}}}}},
		{"header-name", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Headers: []gwv1.HTTPHeaderMatch{{Name: "X-A;pwned", Value: "1"}}}}}},
		{"query-name", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{QueryParams: []gwv1.HTTPQueryParamMatch{{Name: "a-b}pwned", Value: "1"}}}}}},
		{"method", gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Method: ptr.To(gwv1.HTTPMethod("GET;pwned"))}}}},
		{"set-header", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
			Set: []gwv1.HTTPHeader{{Name: "X-A", Value: "v\npwned"}}}}}}},
		{"resp-header", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterResponseHeaderModifier, ResponseHeaderModifier: &gwv1.HTTPHeaderFilter{
			Remove: []string{"X-A pwned"}}}}}},
		{"redirect-host", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
			Hostname: ptr.To(gwv1.PreciseHostname("a.example.com;pwned"))}}}}},
		{"redirect-scheme", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
			Scheme: ptr.To("javascript")}}}}},
		{"redirect-code", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect, RequestRedirect: &gwv1.HTTPRequestRedirectFilter{
			StatusCode: ptr.To(200)}}}}},
		{"rewrite-path", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{
			Path: &gwv1.HTTPPathModifier{Type: gwv1.FullPathHTTPPathModifier, ReplaceFullPath: ptr.To("/a$pwned")}}}}}},
		{"mirror", gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestMirror}}}},
	}
	good := httpRoute("good", 0, nil, gwv1.HTTPRouteRule{})
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			r := httpRoute("bad-"+b.name, 1, nil, b.rule)
			be := [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}
			out := Render(Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{
				{Route: good, Attach: []HTTPAttachment{{Port: 8080}}, Backends: be},
				{Route: r, Attach: []HTTPAttachment{{Port: 8080}}, Backends: be},
			}}, Options{Dir: testDir})
			if len(out.Problems) != 1 || out.Problems[0].Name != r.Name || out.Problems[0].Reason != ReasonInvalidHTTPRoute {
				t.Fatalf("problems %v, want one %s on %s", out.Problems, ReasonInvalidHTTPRoute, r.Name)
			}
			if ValidateHTTPRoute(r) == nil {
				t.Error("ValidateHTTPRoute accepted it")
			}
			if strings.Contains(out.Text, "pwned") || strings.Contains(out.Text, "bad-") {
				t.Errorf("the bad route reached the text:\n%s", out.Text)
			}
			if !strings.Contains(out.Text, "default/good") {
				t.Error("the good route is gone")
			}
		})
	}
}

// TestHTTPRouteIngressPort: a listener on the Ingress port is refused (one
// nginx cannot serve both on one port without mixing their hosts).
func TestHTTPRouteIngressPort(t *testing.T) {
	in := Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{{Route: httpRoute("r", 0, nil, gwv1.HTTPRouteRule{}),
		Attach: []HTTPAttachment{{Port: 80, Listener: "web"}}, Backends: [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}}}}
	out := Render(in, Options{Dir: testDir})
	if len(out.Problems) != 1 || !strings.Contains(out.Problems[0].Message, "Ingress port") {
		t.Fatalf("problems %v", out.Problems)
	}
	if strings.Contains(out.Text, "httproute_0_0") {
		t.Error("route rendered on the Ingress port")
	}
}

// TestHTTPRouteHostnames: servers per hostname; a wildcard route's rules
// also apply under a more specific host's server, after that host's own.
func TestHTTPRouteHostnames(t *testing.T) {
	be := [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}
	wild := httpRoute("wild", 0, nil, gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/w")}}})
	exactH := httpRoute("exact", 1, nil, gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, "/e")}}})
	out := Render(Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{
		{Route: wild, Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{"*.example.com"}}}, Backends: be},
		{Route: exactH, Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{"a.example.com"}}}, Backends: be},
	}}, Options{Dir: testDir})
	nginxTest(t, out)
	if got := dispatch(t, out.Text, "a.example.com", "^~", "/w/"); strings.Join(got, " ") != "0-0-0" {
		t.Errorf("a.example.com /w/: %v", got)
	}
	if !strings.Contains(out.Text, `server_name "*.example.com";`) || !strings.Contains(out.Text, "listen 8080 default_server;") {
		t.Errorf("servers:\n%s", out.Text)
	}
	for _, c := range []struct {
		h, s string
		want bool
	}{{"", "a.b", true}, {"*.example.com", "a.example.com", true}, {"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false}, {"*.example.com", "*.a.example.com", true}, {"a.example.com", "b.example.com", false}} {
		if covers(c.h, c.s) != c.want {
			t.Errorf("covers(%q, %q) = %v", c.h, c.s, !c.want)
		}
	}
}

// TestHTTPRouteTLS: an HTTPS listener's Secret becomes a certificate file
// and an ssl server; a missing Secret refuses handshakes and is reported;
// nginx -t accepts both.
func TestHTTPRouteTLS(t *testing.T) {
	crt, key := selfSigned(t, "secure.example.com")
	be := [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}
	in := Input{Settings: DefaultSettings(), Secrets: map[string]*corev1.Secret{"gw/cert": tlsSecret("gw", "cert", crt, key)}, HTTPRoutes: []HTTPRoute{
		{Route: httpRoute("secure", 0, nil, gwv1.HTTPRouteRule{}), Attach: []HTTPAttachment{{Port: 8443, Hostnames: []string{"secure.example.com"}, TLSSecret: "gw/cert"}}, Backends: be},
		{Route: httpRoute("nocert", 1, nil, gwv1.HTTPRouteRule{}), Attach: []HTTPAttachment{{Port: 9443, TLSSecret: "gw/missing"}}, Backends: be},
	}}
	out := Render(in, Options{Dir: testDir})
	nginxTest(t, out)
	if len(out.Certs) != 1 {
		t.Errorf("certs %v", out.Certs)
	}
	for name := range out.Certs {
		if !strings.Contains(out.Text, "ssl_certificate \""+testDir+"/certs/"+name+"\";") {
			t.Errorf("no ssl_certificate for %s:\n%s", name, out.Text)
		}
	}
	for _, want := range []string{"listen 8443 ssl;", "listen 8443 ssl default_server;", "listen 9443 ssl default_server;", "ssl_reject_handshake on; # no valid certificate"} {
		if !strings.Contains(out.Text, want) {
			t.Errorf("missing %q:\n%s", want, out.Text)
		}
	}
	if len(out.Problems) != 1 || out.Problems[0].Name != "nocert" || out.Problems[0].Reason != ReasonInvalidTLS {
		t.Errorf("problems %v", out.Problems)
	}
}

// TestHTTPRouteRedirectCodes: 301 and 302 (core) and 303, 307, 308
// (extended) are nginx redirects with a Location; other codes are refused.
func TestHTTPRouteRedirectCodes(t *testing.T) {
	for _, code := range []int{301, 302, 303, 307, 308} {
		r := httpRoute("r", 0, nil, gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
			RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Hostname: ptr.To(gwv1.PreciseHostname("new.example")), StatusCode: ptr.To(code)}}}})
		if err := ValidateHTTPRoute(r); err != nil {
			t.Errorf("%d: %v", code, err)
			continue
		}
		out := Render(Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{{Route: r, Attach: []HTTPAttachment{{Port: 8080}}}}}, Options{Dir: testDir})
		if want := fmt.Sprintf(`return %d "http://new.example:8080$request_uri";`, code); !strings.Contains(out.Text, want) {
			t.Errorf("%d: no %s in\n%s", code, want, out.Text)
		}
	}
	for _, code := range []int{200, 304, 404} {
		r := httpRoute("r", 0, nil, gwv1.HTTPRouteRule{Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
			RequestRedirect: &gwv1.HTTPRequestRedirectFilter{StatusCode: ptr.To(code)}}}})
		if ValidateHTTPRoute(r) == nil {
			t.Errorf("%d accepted", code)
		}
	}
}

// TestHTTPRouteRedirectKeepsScheme: a redirect without a scheme keeps the
// request's, https on an HTTPS listener, and then its port is the
// listener's (443 left out); a scheme or port set wins.
func TestHTTPRouteRedirectKeepsScheme(t *testing.T) {
	redirect := func(path string, scheme *string, port *gwv1.PortNumber) gwv1.HTTPRouteRule {
		return gwv1.HTTPRouteRule{Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, path)}},
			Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestRedirect,
				RequestRedirect: &gwv1.HTTPRequestRedirectFilter{Hostname: ptr.To(gwv1.PreciseHostname("example.org")), Scheme: scheme, Port: port}}}}
	}
	r := httpRoute("r", 0, nil,
		redirect("/nil", nil, nil), redirect("/nil-8443", nil, ptr.To(gwv1.PortNumber(8443))), redirect("/http", ptr.To("http"), nil))
	for _, c := range []struct {
		at   HTTPAttachment
		want []string
	}{
		{HTTPAttachment{Port: 443, ListenPort: 61001, TLSSecret: "gw/cert"}, []string{`"https://example.org$request_uri"`, `"https://example.org:8443$request_uri"`, `"http://example.org$request_uri"`}},
		{HTTPAttachment{Port: 8080, ListenPort: 61002}, []string{`"http://example.org:8080$request_uri"`, `"http://example.org:8443$request_uri"`, `"http://example.org$request_uri"`}},
	} {
		out := Render(Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{{Route: r, Attach: []HTTPAttachment{c.at}}}}, Options{Dir: testDir})
		for _, w := range c.want {
			if !strings.Contains(out.Text, "return 302 "+w+";") {
				t.Errorf("listener %d: no redirect to %s in\n%s", c.at.Port, w, out.Text)
			}
		}
	}
}
