package ingress

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// ReasonInvalidHTTPRoute is the Event reason of an HTTPRoute Render skips.
const ReasonInvalidHTTPRoute = "InvalidHTTPRoute"

// HTTPRoute is an HTTPRoute as the Gateway translation attached it: where
// it is served and what each rule's backendRefs resolved to.
type HTTPRoute struct {
	Route *gwv1.HTTPRoute
	// Attach lists the listeners the route is attached to.
	Attach []HTTPAttachment
	// Backends holds, per rule, its backendRefs in order.
	Backends [][]HTTPBackend
}

// HTTPAttachment is one listener a route serves on.
type HTTPAttachment struct {
	// Port is the listener's port (the default port of redirects).
	Port int32
	// ListenPort is the port nginx serves the listener on; the dataplanes
	// forward the Gateway address's Port to it (0: Port itself). One per
	// Gateway and listener port, so Gateways sharing a port stay apart.
	ListenPort int32
	// Hostnames are the listener's hostname intersected with the route's;
	// empty: any host.
	Hostnames []string
	// Listener names the Gateway listener, for comments.
	Listener string
	// TLSSecret is "namespace/name" of the certificate of an HTTPS
	// listener (a kubernetes.io/tls Secret); empty: plain HTTP.
	TLSSecret string
	// AnyHost marks a listener without a hostname: its certificate also
	// serves the names no route covers (they get 404, not a refused
	// handshake; conformance HTTPRouteHTTPSListener).
	AnyHost bool
}

// HTTPBackend is one backendRef: the Service VIP and port, or Invalid (its
// share of requests answers 500, as the spec requires).
type HTTPBackend struct {
	Addr    netip.AddrPort
	Weight  int32
	Invalid bool
}

// candidate is one match of one rule on one hostname.
type candidate struct {
	host    string
	exact   bool
	path    string // for PathPrefix without its trailing slash ("" for /)
	method  string
	headers [][2]string // name (lower case), value
	query   [][2]string
	route   *HTTPRoute
	age     int // index of the route, oldest first
	tls     string
	anyHost bool // from a listener without a hostname
	rule    int
	match   int
	port    int32
}

func (c *candidate) id() string { return fmt.Sprintf("%d-%d-%d", c.age, c.rule, c.match) }

// hostRank orders hostnames: exact before wildcard, longer first, "" last.
func hostRank(h string) (int, int) {
	switch {
	case h == "":
		return 2, 0
	case strings.HasPrefix(h, "*."):
		return 1, -len(h)
	}
	return 0, -len(h)
}

// less is the Gateway API precedence: hostname, Exact over PathPrefix,
// longest path, method, most headers, most query params, oldest route
// (then namespace/name), rule order, match order.
func less(a, b *candidate) bool {
	ar, al := hostRank(a.host)
	br, bl := hostRank(b.host)
	switch {
	case ar != br:
		return ar < br
	case al != bl:
		return al < bl
	case a.exact != b.exact:
		return a.exact
	case len(a.path) != len(b.path):
		return len(a.path) > len(b.path)
	case (a.method != "") != (b.method != ""):
		return a.method != ""
	case len(a.headers) != len(b.headers):
		return len(a.headers) > len(b.headers)
	case len(a.query) != len(b.query):
		return len(a.query) > len(b.query)
	case a.age != b.age:
		return a.age < b.age
	case a.rule != b.rule:
		return a.rule < b.rule
	}
	return a.match < b.match
}

// covers reports whether route hostname h applies to requests for server s.
func covers(h, s string) bool {
	if h == "" || h == s {
		return true
	}
	return strings.HasPrefix(h, "*.") && s != "" && strings.HasSuffix(s, h[1:]) && len(s) > len(h)-1
}

// prefixCovers reports whether PathPrefix p (trimmed) matches path x.
func prefixCovers(p, x string) bool {
	return p == "" || x == p || strings.HasPrefix(x, p+"/")
}

type httpRenderer struct {
	dir      string
	reserved map[int32]bool
	keep     int
	problems []Problem
	b        strings.Builder
	maps     strings.Builder
	conds    map[string]string // "var\x00value" -> map variable
	combos   map[string]string
	ups      map[string]bool
	need500  bool
	// secrets are the TLS Secrets by "namespace/name"; certs receives the
	// certificate files (Output.Certs), certFiles their paths by Secret.
	secrets   map[string]*corev1.Secret
	certs     map[string][]byte
	certFiles map[string]string
}

// renderHTTPRoutes renders the HTTPRoutes into server and upstream blocks
// inside http {}. Ports in reserved (the Ingress ports) are refused.
func renderHTTPRoutes(routes []HTTPRoute, dir string, reserved []int, keepalive int, secrets map[string]*corev1.Secret, certs map[string][]byte) (string, []Problem) {
	if len(routes) == 0 {
		return "", nil
	}
	r := &httpRenderer{dir: dir, secrets: secrets, certs: certs, certFiles: map[string]string{}, reserved: map[int32]bool{}, keep: keepalive, conds: map[string]string{}, combos: map[string]string{}, ups: map[string]bool{}}
	for _, p := range reserved {
		r.reserved[int32(p)] = true
	}
	sorted := append([]HTTPRoute(nil), routes...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i].Route, sorted[j].Route
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	byPort := map[int32][]*candidate{}
	for i := range sorted {
		hr := &sorted[i]
		if err := ValidateHTTPRoute(hr.Route); err != nil {
			r.problem(hr, "skipped: "+err.Error())
			continue
		}
		served := false
		for _, at := range hr.Attach {
			lp := at.ListenPort
			if lp == 0 {
				lp = at.Port
			}
			if r.reserved[lp] {
				r.problem(hr, fmt.Sprintf("listener %s: nginx port %d is an Ingress port; HTTPRoutes need another one", at.Listener, lp))
				continue
			}
			hosts := at.Hostnames
			if len(hosts) == 0 {
				hosts = []string{""}
			}
			for _, h := range hosts {
				for _, c := range candidates(hr, i, h, at.Port) {
					c.tls, c.anyHost = at.TLSSecret, at.AnyHost
					byPort[lp] = append(byPort[lp], c)
				}
			}
			served = true
		}
		if served {
			r.upstreams(i, hr)
		}
	}
	ports := make([]int32, 0, len(byPort))
	for p := range byPort {
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	for _, p := range ports {
		r.port(p, byPort[p])
	}
	if r.need500 {
		fmt.Fprintf(&r.b, "\n    # backendRefs that are invalid keep their share of weight and answer 500\n    server {\n        listen %s;\n        return 500;\n    }\n", quote("unix:"+r.sock500()))
	}
	return r.maps.String() + r.b.String(), r.problems
}

func (r *httpRenderer) sock500() string { return filepath.Join(r.dir, "http500.sock") }

func (r *httpRenderer) problem(hr *HTTPRoute, msg string) {
	r.problems = append(r.problems, Problem{Kind: "HTTPRoute", Namespace: hr.Route.Namespace, Name: hr.Route.Name, Reason: ReasonInvalidHTTPRoute, Message: msg})
}

func upstreamName(age, rule int) string { return fmt.Sprintf("httproute_%d_%d", age, rule) }

// upstreams writes one upstream per rule with backends: the VIPs with
// their weights (0 left out), invalid ones on the 500 socket.
func (r *httpRenderer) upstreams(age int, hr *HTTPRoute) {
	for i := range hr.Route.Spec.Rules {
		if i >= len(hr.Backends) {
			break
		}
		var lines []string
		valid := 0
		for _, b := range hr.Backends[i] {
			if b.Weight <= 0 {
				continue
			}
			if b.Invalid {
				lines = append(lines, fmt.Sprintf("        server %s weight=%d;", quote("unix:"+r.sock500()), b.Weight))
				continue
			}
			valid++
			lines = append(lines, fmt.Sprintf("        server %s weight=%d;", b.Addr.String(), b.Weight))
		}
		if valid == 0 {
			continue // the rule answers 500
		}
		if len(lines) > valid {
			r.need500 = true
		}
		name := upstreamName(age, i)
		r.ups[name] = true
		fmt.Fprintf(&r.b, "\n    # %s rule %d\n    upstream %s {\n%s\n", comment(hr.Route.Namespace+"/"+hr.Route.Name), i, name, strings.Join(lines, "\n"))
		if r.keep > 0 {
			fmt.Fprintf(&r.b, "        keepalive %d;\n", r.keep)
		}
		r.b.WriteString("    }\n")
	}
}

// candidates lists the matches of every rule of hr on hostname h.
func candidates(hr *HTTPRoute, age int, h string, port int32) []*candidate {
	var out []*candidate
	for ri, rule := range hr.Route.Spec.Rules {
		matches := rule.Matches
		if len(matches) == 0 {
			matches = []gwv1.HTTPRouteMatch{{}}
		}
		for mi, m := range matches {
			c := &candidate{host: h, route: hr, age: age, rule: ri, match: mi, port: port}
			if m.Path != nil && m.Path.Type != nil && *m.Path.Type == gwv1.PathMatchExact {
				c.exact, c.path = true, "/"
				if m.Path.Value != nil {
					c.path = *m.Path.Value
				}
			} else if m.Path != nil && m.Path.Value != nil {
				c.path = strings.TrimRight(*m.Path.Value, "/")
			}
			if m.Method != nil {
				c.method = string(*m.Method)
			}
			seen := map[string]bool{}
			for _, hm := range m.Headers {
				n := strings.ToLower(string(hm.Name))
				if !seen[n] { // the spec: only the first match of a name counts
					seen[n] = true
					c.headers = append(c.headers, [2]string{n, hm.Value})
				}
			}
			seen = map[string]bool{}
			for _, q := range m.QueryParams {
				if !seen[string(q.Name)] {
					seen[string(q.Name)] = true
					c.query = append(c.query, [2]string{string(q.Name), q.Value})
				}
			}
			out = append(out, c)
		}
	}
	return out
}

// loc is one nginx location of a server.
type loc struct {
	match, path string
	cands       []*candidate
}

// port writes the servers of one listener port: one per hostname, each
// with every candidate whose hostname covers it.
func (r *httpRenderer) port(p int32, cands []*candidate) {
	hosts := map[string]bool{}
	for _, c := range cands {
		hosts[c.host] = true
	}
	names := make([]string, 0, len(hosts))
	for h := range hosts {
		names = append(names, h)
	}
	sort.Strings(names) // "" first: the default server
	ssl := ""
	for _, c := range cands {
		if c.tls != "" {
			ssl = " ssl"
		}
	}
	if !hosts[""] {
		extra := ""
		if ssl != "" {
			var any []*candidate
			for _, c := range cands {
				if c.anyHost {
					any = append(any, c)
				}
			}
			if file := r.cert(any); file != "" {
				extra = fmt.Sprintf("\n        ssl_certificate %s;\n        ssl_certificate_key %s;", quote(file), quote(file))
			} else {
				extra = "\n        ssl_reject_handshake on;" // no certificate for unknown names
			}
		}
		fmt.Fprintf(&r.b, "\n    server {\n        listen %d%s default_server;%s\n        server_name _;\n        return 404;\n    }\n", p, ssl, extra)
	}
	for _, s := range names {
		var mine []*candidate
		for _, c := range cands {
			if covers(c.host, s) {
				mine = append(mine, c)
			}
		}
		sort.SliceStable(mine, func(i, j int) bool { return less(mine[i], mine[j]) })
		r.server(p, ssl, s, mine)
	}
}

func (r *httpRenderer) server(p int32, ssl, host string, cands []*candidate) {
	locs := map[string]*loc{}
	add := func(match, path string) {
		if _, ok := locs[match+" "+path]; !ok {
			locs[match+" "+path] = &loc{match: match, path: path}
		}
	}
	add("", "/")
	for _, c := range cands {
		switch {
		case c.exact:
			add("=", c.path)
		case c.path != "":
			add("=", c.path)
			add("^~", c.path+"/")
		}
	}
	keys := make([]string, 0, len(locs))
	for k, l := range locs {
		keys = append(keys, k)
		for _, c := range cands {
			var ok bool
			switch l.match {
			case "=":
				ok = (c.exact && c.path == l.path) || (!c.exact && prefixCovers(c.path, l.path))
			case "^~":
				ok = !c.exact && prefixCovers(c.path, strings.TrimSuffix(l.path, "/"))
			default:
				ok = !c.exact && c.path == ""
			}
			if ok {
				l.cands = append(l.cands, c)
			}
		}
	}
	sort.Strings(keys)
	fmt.Fprintf(&r.b, "\n    server {\n")
	if host == "" {
		fmt.Fprintf(&r.b, "        listen %d%s default_server;\n        server_name _;\n", p, ssl)
	} else {
		fmt.Fprintf(&r.b, "        listen %d%s;\n        server_name %s;\n", p, ssl, quote(host))
	}
	// The Host header goes upstream as the client sent it, port included
	// (conformance HTTPRouteHostnameIntersection: "very.specific.com:1234");
	// nginx's $host drops the port. A proxy_set_header here replaces the
	// http level's, so the others are repeated.
	r.b.WriteString(routeProxyHeaders)
	if ssl != "" {
		if file := r.cert(cands); file != "" {
			fmt.Fprintf(&r.b, "        ssl_certificate %s;\n        ssl_certificate_key %s;\n", quote(file), quote(file))
		} else {
			r.b.WriteString("        ssl_reject_handshake on; # no valid certificate\n")
		}
	}
	used := map[string]*candidate{}
	for _, k := range keys {
		l := locs[k]
		if l.match == "" {
			fmt.Fprintf(&r.b, "        location %s {\n", quote(l.path))
		} else {
			fmt.Fprintf(&r.b, "        location %s %s {\n", l.match, quote(l.path))
		}
		for _, c := range l.cands {
			used[c.id()] = c
			target := valueQuote(internalPrefix + c.id() + "$uri")
			v := r.condVar(c)
			if v == "" {
				fmt.Fprintf(&r.b, "            rewrite ^ %s last; # %s\n", target, comment(c.route.Route.Namespace+"/"+c.route.Route.Name))
				break // the rest can never be reached
			}
			fmt.Fprintf(&r.b, "            if (%s) { rewrite ^ %s last; } # %s\n", v, target, comment(c.route.Route.Namespace+"/"+c.route.Route.Name))
		}
		fmt.Fprintf(&r.b, "            return 404;\n        }\n")
	}
	ids := make([]string, 0, len(used))
	for id := range used {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r.internal(used[id])
	}
	r.b.WriteString("    }\n")
}

// cert returns the certificate file of the first candidate (the most
// specific hostname first) with a TLS Secret, or "" (reported) when that
// Secret is missing or malformed.
func (r *httpRenderer) cert(cands []*candidate) string {
	for _, c := range cands {
		if c.tls == "" {
			continue
		}
		if f, ok := r.certFiles[c.tls]; ok {
			return f
		}
		sec := r.secrets[c.tls]
		if sec == nil {
			r.problems = append(r.problems, Problem{Kind: "HTTPRoute", Namespace: c.route.Route.Namespace, Name: c.route.Route.Name, Reason: ReasonInvalidTLS,
				Message: "the listener's Secret " + c.tls + " is not found (or not of type kubernetes.io/tls): TLS handshakes are refused"})
			r.certFiles[c.tls] = ""
			return ""
		}
		pem, file, err := tlsFile(sec)
		if err != nil {
			r.problems = append(r.problems, Problem{Kind: "HTTPRoute", Namespace: c.route.Route.Namespace, Name: c.route.Route.Name, Reason: ReasonInvalidTLS,
				Message: "the listener's Secret " + c.tls + ": " + err.Error() + ": TLS handshakes are refused"})
			r.certFiles[c.tls] = ""
			return ""
		}
		r.certs[file] = pem
		r.certFiles[c.tls] = filepath.Join(r.dir, "certs", file)
		return r.certFiles[c.tls]
	}
	return ""
}

// routeProxyHeaders are the request headers of HTTPRoute servers.
const routeProxyHeaders = `        proxy_set_header Connection "";
        proxy_set_header Host $http_host;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header X-Forwarded-Proto $scheme;
`

// CheckTLSSecret reports why a Secret cannot serve as a certificate
// (wrong type, or a chain and key that do not parse or do not match), or
// nil. The Gateway translation uses it for listener ResolvedRefs.
func CheckTLSSecret(sec *corev1.Secret) error {
	if sec.Type != corev1.SecretTypeTLS {
		return fmt.Errorf("type %s, want %s", sec.Type, corev1.SecretTypeTLS)
	}
	_, _, err := tlsFile(sec)
	return err
}

// tlsFile checks a TLS Secret and returns its chain and key as one PEM
// file named by its content hash (as addTLS names Ingress certificates).
func tlsFile(sec *corev1.Secret) ([]byte, string, error) {
	crt, k := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
	if _, err := tls.X509KeyPair(crt, k); err != nil {
		return nil, "", err
	}
	pem := append(append(bytes.TrimSpace(append([]byte(nil), crt...)), '\n'), bytes.TrimSpace(k)...)
	pem = append(pem, '\n')
	sum := sha256.Sum256(pem)
	return pem, hex.EncodeToString(sum[:12]) + ".pem", nil
}

// condVar returns the variable that is "1" when the method, header and
// query conditions of c hold ("" when c has none). Each condition is a map
// on one nginx variable with the value as a plain string (no regex); a
// candidate with several conditions gets a map over their 0/1 digits.
func (r *httpRenderer) condVar(c *candidate) string {
	var vars []string
	one := func(src, value string) {
		k := src + "\x00" + value
		v, ok := r.conds[k]
		if !ok {
			v = fmt.Sprintf("$sy_c%d", len(r.conds))
			r.conds[k] = v
			// A regex, because nginx compares map strings without case
			// and the spec's Exact match is case-sensitive.
			fmt.Fprintf(&r.maps, "\n    map %s %s {\n        %s 1;\n        default 0;\n    }\n", src, v, valueQuote("~^"+regexLiteral(value)+"$"))
		}
		vars = append(vars, v)
	}
	if c.method != "" {
		one("$request_method", c.method)
	}
	for _, h := range c.headers {
		one("$http_"+strings.ReplaceAll(h[0], "-", "_"), h[1])
	}
	for _, q := range c.query {
		one("$arg_"+q[0], q[1])
	}
	switch len(vars) {
	case 0:
		return ""
	case 1:
		return vars[0]
	}
	key := strings.Join(vars, "")
	v, ok := r.combos[key]
	if !ok {
		v = fmt.Sprintf("$sy_m%d", len(r.combos))
		r.combos[key] = v
		fmt.Fprintf(&r.maps, "\n    map \"%s\" %s {\n        %s 1;\n        default 0;\n    }\n", key, v, strings.Repeat("1", len(vars)))
	}
	return v
}

// regexLiteral writes a validated value as a regex matching exactly it:
// every character but letters and digits goes into brackets (headerValueRE
// admits none of '[', ']', '^' or '\\', which brackets could not hold).
func regexLiteral(v string) string {
	var b strings.Builder
	for _, ch := range v {
		if ch < 0x80 && (ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9') {
			b.WriteRune(ch)
		} else {
			b.WriteString("[" + string(ch) + "]")
		}
	}
	return b.String()
}

// regexPath writes a validated path as a regex: its only metacharacters
// (. * + ( )) go into brackets, so no backslash is needed.
func regexPath(p string) string {
	var b strings.Builder
	for _, ch := range p {
		if strings.ContainsRune(".*+()", ch) {
			b.WriteString("[" + string(ch) + "]")
		} else {
			b.WriteRune(ch)
		}
	}
	return b.String()
}

// internal writes the location a candidate dispatches to: filters, then a
// redirect, a 500 or the proxy to the rule's upstream.
func (r *httpRenderer) internal(c *candidate) {
	rule := c.route.Route.Spec.Rules[c.rule]
	base := regexPath(internalPrefix + c.id())
	fmt.Fprintf(&r.b, "        location ^~ %s {\n            internal;\n            # %s rule %d match %d\n", quote(internalPrefix+c.id()+"/"), comment(c.route.Route.Namespace+"/"+c.route.Route.Name), c.rule, c.match)
	var reqHdr, respHdr *gwv1.HTTPHeaderFilter
	var redirect *gwv1.HTTPRequestRedirectFilter
	var rewrite *gwv1.HTTPURLRewriteFilter
	for _, f := range rule.Filters {
		switch f.Type {
		case gwv1.HTTPRouteFilterRequestHeaderModifier:
			reqHdr = f.RequestHeaderModifier
		case gwv1.HTTPRouteFilterResponseHeaderModifier:
			respHdr = f.ResponseHeaderModifier
		case gwv1.HTTPRouteFilterRequestRedirect:
			redirect = f.RequestRedirect
		case gwv1.HTTPRouteFilterURLRewrite:
			rewrite = f.URLRewrite
		}
	}
	if respHdr != nil {
		for _, h := range respHdr.Set {
			fmt.Fprintf(&r.b, "            proxy_hide_header %s;\n            add_header %s %s always;\n", quote(string(h.Name)), quote(string(h.Name)), valueQuote(h.Value))
		}
		for _, h := range respHdr.Add {
			fmt.Fprintf(&r.b, "            add_header %s %s always;\n", quote(string(h.Name)), valueQuote(h.Value))
		}
		for _, n := range respHdr.Remove {
			fmt.Fprintf(&r.b, "            proxy_hide_header %s;\n", quote(n))
		}
	}
	var pathMod *gwv1.HTTPPathModifier
	if redirect != nil {
		pathMod = redirect.Path
	} else if rewrite != nil {
		pathMod = rewrite.Path
	}
	// The path the request goes on with: "$1" is the part after the
	// internal prefix (the request's path), or after the matched prefix.
	// A redirect rewrites without a flag (break would skip its return).
	flag := " break"
	if redirect != nil {
		flag = ""
	} else if !r.ups[upstreamName(c.age, c.rule)] {
		// Before any rewrite: "rewrite ... break" would skip this return
		// and nginx would serve a file, 404 (conformance
		// HTTPRouteInvalidBackendRefUnknownKind found it).
		fmt.Fprintf(&r.b, "            return 500; # no valid backendRef with weight\n        }\n")
		return
	}
	switch {
	case redirect != nil && pathMod == nil:
		// $request_uri below: the path as the client sent it.
	case pathMod != nil && pathMod.Type == gwv1.FullPathHTTPPathModifier:
		fmt.Fprintf(&r.b, "            rewrite ^ %s%s;\n", quote(*pathMod.ReplaceFullPath), flag)
	case pathMod != nil && pathMod.Type == gwv1.PrefixMatchHTTPPathModifier:
		np := strings.TrimRight(*pathMod.ReplacePrefixMatch, "/")
		whole := np
		if whole == "" {
			whole = "/"
		}
		fmt.Fprintf(&r.b, "            rewrite %s %s%s;\n", valueQuote("^"+base+regexPath(c.path)+"$"), quote(whole), flag)
		fmt.Fprintf(&r.b, "            rewrite %s %s%s;\n", valueQuote("^"+base+regexPath(c.path)+"(/.*)$"), valueQuote(np+"$1"), flag)
	default:
		fmt.Fprintf(&r.b, "            rewrite %s %s break;\n", valueQuote("^"+base+"(/.*)$"), valueQuote("$1"))
	}
	if redirect != nil {
		code := 302
		if redirect.StatusCode != nil {
			code = *redirect.StatusCode
		}
		// Without a scheme the request's stays: https on an HTTPS
		// listener (conformance HTTPRouteRedirectPortAndScheme).
		scheme := "http"
		if c.tls != "" {
			scheme = "https"
		}
		port := c.port
		if redirect.Scheme != nil {
			scheme = *redirect.Scheme
			port = 80
			if scheme == "https" {
				port = 443
			}
		}
		if redirect.Port != nil {
			port = int32(*redirect.Port)
		}
		host := "$host"
		if redirect.Hostname != nil {
			host = string(*redirect.Hostname)
		}
		hp := host
		if !(scheme == "http" && port == 80) && !(scheme == "https" && port == 443) {
			hp += ":" + strconv.Itoa(int(port))
		}
		path := "$request_uri"
		if pathMod != nil {
			path = "$uri$is_args$args"
		}
		fmt.Fprintf(&r.b, "            return %d %s;\n        }\n", code, valueQuote(scheme+"://"+hp+path))
		return
	}
	if reqHdr != nil || (rewrite != nil && rewrite.Hostname != nil) {
		// proxy_set_header at this level replaces the inherited ones.
		set := map[string]string{"connection": `""`, "host": "$http_host", "x-forwarded-for": "$proxy_add_x_forwarded_for", "x-forwarded-proto": "$scheme"}
		order := []string{"Connection", "Host", "X-Forwarded-For", "X-Forwarded-Proto"}
		if rewrite != nil && rewrite.Hostname != nil {
			set["host"] = quote(string(*rewrite.Hostname))
		}
		if reqHdr != nil {
			for _, h := range reqHdr.Set {
				k := strings.ToLower(string(h.Name))
				if _, ok := set[k]; !ok {
					order = append(order, string(h.Name))
				}
				set[k] = valueQuote(h.Value)
			}
			for _, h := range reqHdr.Add {
				k := strings.ToLower(string(h.Name))
				if _, ok := set[k]; !ok {
					order = append(order, string(h.Name))
				}
				// Appends to what the client sent, as a list.
				v := "$sy_add" + strconv.Itoa(len(r.conds)+len(r.combos))
				r.conds["add\x00"+v] = v
				fmt.Fprintf(&r.maps, "\n    map $http_%s %s {\n        \"\" %s;\n        default %s;\n    }\n", strings.ReplaceAll(k, "-", "_"), v, valueQuote(h.Value), valueQuote("$http_"+strings.ReplaceAll(k, "-", "_")+","+h.Value))
				set[k] = v
			}
			for _, n := range reqHdr.Remove {
				k := strings.ToLower(n)
				if _, ok := set[k]; !ok {
					order = append(order, n)
				}
				set[k] = `""`
			}
		}
		for _, n := range order {
			fmt.Fprintf(&r.b, "            proxy_set_header %s %s;\n", quote(n), set[strings.ToLower(n)])
		}
	}
	fmt.Fprintf(&r.b, "            proxy_pass http://%s;\n        }\n", upstreamName(c.age, c.rule))
}

// valueQuote quotes a header value, a map value or a redirect target:
// like quote, but spaces and our own "$" variables are allowed. The values
// from the API passed headerValueRE or validPath, which admit neither '$'
// nor a quote; "$" here comes only from the renderer's own variables.
func valueQuote(s string) string {
	if strings.ContainsAny(s, "\"';{}#\\\r\n\t\x00") {
		panic(fmt.Sprintf("ingress: unsafe value %q reached the HTTPRoute renderer", s))
	}
	return `"` + s + `"`
}
