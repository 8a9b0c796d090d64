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
	"text/template"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Upstream modes.
const (
	// UpstreamsVIP sends each request to the Service's ClusterIP:port; the
	// kernel picks the pod (by weight), so endpoint changes never reload
	// nginx. steelyard's design.
	UpstreamsVIP = "vip"
	// UpstreamsPods lists the ready pod addresses in the upstream, as
	// nginx's own controller does; every endpoint change reloads nginx.
	// A baseline for comparison.
	UpstreamsPods = "pods"
)

// Event reasons of the Problems Render reports.
const (
	ReasonInvalidIngress = "InvalidIngress"
	ReasonInvalidTLS     = "InvalidTLS"
	ReasonNoBackend      = "BackendNotFound"
	ReasonPathConflict   = "PathConflict"
	ReasonInvalidConfig  = "InvalidConfig"
)

// Options are the parts of the rendered config that come from flags.
type Options struct {
	// Upstreams is UpstreamsVIP (default) or UpstreamsPods.
	Upstreams string
	// Dir is nginx's working directory: pid file, temporary files and
	// certificates (Dir/certs) live there.
	Dir string
	// HTTPPort and HTTPSPort are the ports nginx listens on (80 and 443
	// when zero).
	HTTPPort, HTTPSPort int
}

// Input is one snapshot of everything the config depends on.
type Input struct {
	// Ingresses are those of our class (see Selected).
	Ingresses []*networkingv1.Ingress
	// Services and Secrets by "namespace/name".
	Services map[string]*corev1.Service
	Secrets  map[string]*corev1.Secret
	// Slices are read only with UpstreamsPods.
	Slices []*discoveryv1.EndpointSlice
	// Settings come from the ConfigMap (ParseSettings).
	Settings Settings
	// HTTPRoutes are the Gateway API routes attached to our HTTP
	// listeners (see httproute.go); they get servers of their own on the
	// listener ports.
	HTTPRoutes []HTTPRoute
}

// Problem is something wrong with one object, reported as a Warning Event
// on it and in the log.
type Problem struct {
	Kind, Namespace, Name string
	Reason, Message       string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s %s/%s: %s: %s", p.Kind, p.Namespace, p.Name, p.Reason, p.Message)
}

// Output is a rendered configuration.
type Output struct {
	// Text is nginx.conf.
	Text string
	// Certs are the certificate files (certificate chain and key in one
	// PEM file) by file name in Dir/certs. Names are content hashes, so a
	// new certificate never overwrites a file the running config uses.
	Certs map[string][]byte
	// Problems lists what was skipped or degraded, per object.
	Problems []Problem
}

// Hash returns the SHA-256 of the text, in hex.
func (o Output) Hash() string {
	h := sha256.Sum256([]byte(o.Text))
	return hex.EncodeToString(h[:])
}

// location is one nginx location block.
type location struct {
	// Match is "=", "^~" or "" (plain prefix, only for "/").
	Match string
	Path  string
	// Exact marks a location from an Exact path: it beats the "="
	// location a Prefix path of the same text generates.
	exact bool
	// Upstream is the upstream to proxy to; when empty, Status is returned.
	Upstream string
	Status   int
	// Source names the Ingress and backend, for the comment.
	Source string
	owner  *networkingv1.Ingress
}

// server is one nginx server block: a host, or the catch-all.
type server struct {
	// Name is the host ("" for the catch-all); ServerName its nginx form.
	Name, ServerName string
	Cert             string // certificate file, or ""
	Locations        []*location
	locs             map[string]*location
}

// upstream is one nginx upstream block.
type upstream struct {
	Name    string
	Servers []string
	Source  string
}

type renderer struct {
	opts      Options
	in        Input
	out       Output
	servers   map[string]*server
	upstreams map[string]*upstream
	// backendErrs collects per-Ingress backend problems, reported once.
	seen map[string]bool
}

// Render turns a snapshot into nginx.conf. An Ingress with any invalid
// host, path or name is skipped as a whole (ReasonInvalidIngress) and the
// others are still served; a missing Service or port answers 503 on its
// paths; a missing or malformed TLS Secret leaves that host on plain HTTP.
func Render(in Input, opts Options) Output {
	if opts.Upstreams == "" {
		opts.Upstreams = UpstreamsVIP
	}
	if opts.HTTPPort == 0 {
		opts.HTTPPort = 80
	}
	if opts.HTTPSPort == 0 {
		opts.HTTPSPort = 443
	}
	r := &renderer{
		opts: opts, in: in,
		out:       Output{Certs: map[string][]byte{}},
		servers:   map[string]*server{},
		upstreams: map[string]*upstream{},
		seen:      map[string]bool{},
	}
	ings := append([]*networkingv1.Ingress(nil), in.Ingresses...)
	// Older Ingresses win conflicts (the rule of other controllers too).
	sort.SliceStable(ings, func(i, j int) bool {
		a, b := ings[i], ings[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	catchAll := r.server("")
	var defaultFrom *networkingv1.Ingress
	var defaultLoc *location
	for _, ing := range ings {
		if err := validIngress(ing); err != nil {
			r.problem(ing, ReasonInvalidIngress, "skipped: "+err.Error())
			continue
		}
		for _, rule := range ing.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			srv := catchAll
			if rule.Host != "" {
				srv = r.server(rule.Host)
			}
			for _, p := range rule.HTTP.Paths {
				r.addPath(srv, ing, p)
			}
		}
		if ing.Spec.DefaultBackend != nil {
			if defaultFrom == nil {
				defaultFrom = ing
				defaultLoc = r.backend(ing, *ing.Spec.DefaultBackend)
				defaultLoc.Source = ing.Namespace + "/" + ing.Name + " defaultBackend " + defaultLoc.Source
			} else {
				r.problem(ing, ReasonPathConflict, fmt.Sprintf("defaultBackend ignored: Ingress %s/%s is older and has one", defaultFrom.Namespace, defaultFrom.Name))
			}
		}
		r.addTLS(ing)
	}
	// Requests that match no path go to the default backend, else 404.
	for _, srv := range r.servers {
		if _, ok := srv.locs["/"]; ok {
			continue
		}
		l := &location{Path: "/", Status: 404, Source: "no rule matches"}
		if defaultLoc != nil {
			c := *defaultLoc
			l = &c
			l.Match, l.Path = "", "/"
		}
		srv.locs["/"] = l
	}
	for _, srv := range r.servers {
		srv.noRedirects()
	}
	gw, problems := renderHTTPRoutes(in.HTTPRoutes, opts.Dir, []int{opts.HTTPPort, opts.HTTPSPort}, in.Settings.UpstreamKeepalive, in.Secrets, r.out.Certs)
	r.out.Problems = append(r.out.Problems, problems...)
	r.out.Text = r.text(gw)
	return r.out
}

// noRedirects adds "= /foo" for each Exact "/foo/" that has none. Without
// it nginx answers a request for /foo with a 301 to /foo/ (its
// auto-redirect for locations ending in a slash), while the spec says
// Exact /foo/ does not match /foo: the request must go where it would go
// without that location (the longest prefix that matches it).
func (s *server) noRedirects() {
	for _, l := range s.locs {
		if l.Match != "=" || len(l.Path) < 2 || !strings.HasSuffix(l.Path, "/") {
			continue
		}
		q := strings.TrimRight(l.Path, "/")
		if _, ok := s.locs["= "+q]; ok {
			continue
		}
		var best *location
		for _, c := range s.locs {
			if c.Match != "=" && strings.HasPrefix(q, c.Path) && (best == nil || len(c.Path) > len(best.Path)) {
				best = c
			}
		}
		if best == nil {
			continue // cannot happen: every server has "/"
		}
		c := *best
		c.Match, c.Path, c.exact = "=", q, false
		s.locs["= "+q] = &c
	}
}

// validIngress checks every value of an Ingress that would reach the
// config; the first error skips the whole Ingress.
func validIngress(ing *networkingv1.Ingress) error {
	if err := validName("namespace", ing.Namespace); err != nil {
		return err
	}
	if err := validName("Ingress", ing.Name); err != nil {
		return err
	}
	checkBackend := func(b networkingv1.IngressBackend) error {
		if b.Service == nil {
			return nil // reported as a missing backend
		}
		if err := validName("Service", b.Service.Name); err != nil {
			return err
		}
		if b.Service.Port.Name != "" && !portNameRE.MatchString(b.Service.Port.Name) {
			return fmt.Errorf("port name %q: want an IANA service name", b.Service.Port.Name)
		}
		return nil
	}
	if b := ing.Spec.DefaultBackend; b != nil {
		if err := checkBackend(*b); err != nil {
			return err
		}
	}
	for _, rule := range ing.Spec.Rules {
		if rule.Host != "" {
			if err := validHost(rule.Host); err != nil {
				return err
			}
		}
		if rule.HTTP == nil {
			continue
		}
		for _, p := range rule.HTTP.Paths {
			if err := validPath(p.Path); err != nil {
				return err
			}
			if p.PathType != nil {
				switch *p.PathType {
				case networkingv1.PathTypeExact, networkingv1.PathTypePrefix, networkingv1.PathTypeImplementationSpecific:
				default:
					return fmt.Errorf("path %q: pathType %q: want Exact, Prefix or ImplementationSpecific", p.Path, *p.PathType)
				}
			}
			if err := checkBackend(p.Backend); err != nil {
				return err
			}
		}
	}
	for _, t := range ing.Spec.TLS {
		for _, h := range t.Hosts {
			if err := validHost(h); err != nil {
				return fmt.Errorf("tls: %w", err)
			}
		}
		if t.SecretName != "" {
			if err := validName("Secret", t.SecretName); err != nil {
				return fmt.Errorf("tls: %w", err)
			}
		}
	}
	return nil
}

func (r *renderer) problem(ing *networkingv1.Ingress, reason, msg string) {
	key := ing.Namespace + "/" + ing.Name + "\x00" + reason + "\x00" + msg
	if r.seen[key] {
		return
	}
	r.seen[key] = true
	r.out.Problems = append(r.out.Problems, Problem{Kind: "Ingress", Namespace: ing.Namespace, Name: ing.Name, Reason: reason, Message: msg})
}

func (r *renderer) server(host string) *server {
	if s, ok := r.servers[host]; ok {
		return s
	}
	s := &server{Name: host, locs: map[string]*location{}}
	switch {
	case host == "":
		s.ServerName = "_"
	case strings.HasPrefix(host, "*."):
		// The Ingress spec's wildcard covers exactly one label; nginx's
		// "*.example.com" would also match a.b.example.com.
		s.ServerName = `~^[^.]+` + strings.ReplaceAll(host[1:], ".", `\.`) + `$`
	default:
		s.ServerName = host
	}
	r.servers[host] = s
	return s
}

// addPath adds the locations of one Ingress path to srv. Exact p is
// "= p"; Prefix p is "= p" and "^~ p/" (p without its trailing slash), so
// it matches by element: nginx picks the exact location first, then the
// longest "^~" prefix, which is the spec's longest-match rule.
func (r *renderer) addPath(srv *server, ing *networkingv1.Ingress, p networkingv1.HTTPIngressPath) {
	exact := p.PathType != nil && *p.PathType == networkingv1.PathTypeExact
	target := r.backend(ing, p.Backend)
	var locs []*location
	if exact {
		locs = append(locs, &location{Match: "=", Path: p.Path, exact: true})
	} else {
		q := strings.TrimRight(p.Path, "/")
		if q == "" {
			locs = append(locs, &location{Match: "", Path: "/"})
		} else {
			locs = append(locs, &location{Match: "=", Path: q}, &location{Match: "^~", Path: q + "/"})
		}
	}
	for _, l := range locs {
		l.Upstream, l.Status, l.Source, l.owner = target.Upstream, target.Status, ing.Namespace+"/"+ing.Name+" "+target.Source, ing
		key := l.Match + " " + l.Path
		if l.Match == "" {
			key = "/"
		}
		old, ok := srv.locs[key]
		switch {
		case !ok:
			srv.locs[key] = l
		case l.exact && !old.exact:
			srv.locs[key] = l // Exact beats Prefix on the same path
		case old.exact && !l.exact:
			// kept
		case old.Upstream != l.Upstream || old.Status != l.Status:
			if old.owner != ing {
				r.problem(ing, ReasonPathConflict, fmt.Sprintf("host %q path %q: served by the older Ingress %s/%s", srv.Name, p.Path, old.owner.Namespace, old.owner.Name))
			}
		}
	}
}

// backend resolves an Ingress backend to an upstream (created on first
// use), or to a 503 location with a reported problem.
func (r *renderer) backend(ing *networkingv1.Ingress, b networkingv1.IngressBackend) *location {
	fail := func(msg string) *location {
		r.problem(ing, ReasonNoBackend, msg+"; its paths answer 503")
		return &location{Status: 503, Source: "(no backend: " + msg + ")"}
	}
	if b.Service == nil {
		return fail("only Service backends are supported")
	}
	key := ing.Namespace + "/" + b.Service.Name
	svc := r.in.Services[key]
	if svc == nil {
		return fail("Service " + key + " not found")
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if (b.Service.Port.Name != "" && p.Name == b.Service.Port.Name) || (b.Service.Port.Name == "" && p.Port == b.Service.Port.Number) {
			if p.Protocol == "" || p.Protocol == corev1.ProtocolTCP {
				sp = p
				break
			}
		}
	}
	portDesc := b.Service.Port.Name
	if portDesc == "" {
		portDesc = strconv.Itoa(int(b.Service.Port.Number))
	}
	if sp == nil {
		return fail("Service " + key + " has no TCP port " + portDesc)
	}
	name := fmt.Sprintf("%s_%s_%d", ing.Namespace, b.Service.Name, sp.Port)
	src := key + ":" + portDesc
	if u, ok := r.upstreams[name]; ok {
		return &location{Upstream: u.Name, Source: src}
	}
	var servers []string
	if r.opts.Upstreams == UpstreamsPods {
		servers = r.podServers(svc, sp)
		if len(servers) == 0 {
			return fail("Service " + key + " has no ready endpoints")
		}
	} else {
		ip, err := validIP(svc.Spec.ClusterIP)
		if err != nil {
			return fail("Service " + key + " has no cluster IP (headless or ExternalName)")
		}
		servers = []string{netip.AddrPortFrom(ip, uint16(sp.Port)).String()}
	}
	r.upstreams[name] = &upstream{Name: name, Servers: servers, Source: src}
	return &location{Upstream: name, Source: src}
}

// podServers lists the ready endpoints of svc's port sp (pods mode).
func (r *renderer) podServers(svc *corev1.Service, sp *corev1.ServicePort) []string {
	set := map[string]bool{}
	for _, sl := range r.in.Slices {
		if sl.Namespace != svc.Namespace || sl.Labels[discoveryv1.LabelServiceName] != svc.Name {
			continue
		}
		var port int32 = -1
		for _, p := range sl.Ports {
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if name == sp.Name && p.Port != nil && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				port = *p.Port
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, a := range ep.Addresses {
				if ip, err := validIP(a); err == nil {
					set[netip.AddrPortFrom(ip, uint16(port)).String()] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// addTLS gives each TLS host of ing a certificate from its Secret; a
// missing or malformed Secret is reported and the host stays plain HTTP.
func (r *renderer) addTLS(ing *networkingv1.Ingress) {
	for _, t := range ing.Spec.TLS {
		if t.SecretName == "" || len(t.Hosts) == 0 {
			r.problem(ing, ReasonInvalidTLS, "tls entry without secretName or hosts ignored")
			continue
		}
		key := ing.Namespace + "/" + t.SecretName
		sec := r.in.Secrets[key]
		if sec == nil {
			r.problem(ing, ReasonInvalidTLS, fmt.Sprintf("Secret %s not found (or not of type kubernetes.io/tls); hosts %v served without TLS", key, t.Hosts))
			continue
		}
		crt, k := sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey]
		if _, err := tls.X509KeyPair(crt, k); err != nil {
			r.problem(ing, ReasonInvalidTLS, fmt.Sprintf("Secret %s: %v; hosts %v served without TLS", key, err, t.Hosts))
			continue
		}
		pem := append(append(bytes.TrimSpace(append([]byte(nil), crt...)), '\n'), bytes.TrimSpace(k)...)
		pem = append(pem, '\n')
		sum := sha256.Sum256(pem)
		file := hex.EncodeToString(sum[:12]) + ".pem"
		r.out.Certs[file] = pem
		for _, h := range t.Hosts {
			srv := r.server(h)
			if srv.Cert == "" {
				srv.Cert = filepath.Join(r.opts.Dir, "certs", file)
			}
		}
	}
}

type tmplData struct {
	Opts      Options
	S         Settings
	Upstreams []*upstream
	Default   *server
	Servers   []*server
	AnyTLS    bool
	// Gateway holds the HTTPRoute blocks, already rendered.
	Gateway string
}

func (r *renderer) text(gateway string) string {
	d := tmplData{Opts: r.opts, S: r.in.Settings, Gateway: gateway}
	for _, u := range r.upstreams {
		d.Upstreams = append(d.Upstreams, u)
	}
	sort.Slice(d.Upstreams, func(i, j int) bool { return d.Upstreams[i].Name < d.Upstreams[j].Name })
	for _, s := range r.servers {
		s.Locations = s.Locations[:0]
		for _, l := range s.locs {
			s.Locations = append(s.Locations, l)
		}
		// "/" last, then exact before prefix, then by path: only for
		// readability (nginx's choice does not depend on order).
		sort.Slice(s.Locations, func(i, j int) bool {
			a, b := s.Locations[i], s.Locations[j]
			if a.Match != b.Match {
				return matchOrder(a.Match) < matchOrder(b.Match)
			}
			return a.Path < b.Path
		})
		if s.Cert != "" {
			d.AnyTLS = true
		}
		if s.Name == "" {
			d.Default = s
		} else {
			d.Servers = append(d.Servers, s)
		}
	}
	sort.Slice(d.Servers, func(i, j int) bool { return d.Servers[i].Name < d.Servers[j].Name })
	var b bytes.Buffer
	if err := confTemplate.Execute(&b, d); err != nil {
		// The template and its data are ours; this is a programming error.
		panic(fmt.Sprintf("ingress: nginx.conf template: %v", err))
	}
	return b.String()
}

func matchOrder(m string) int {
	switch m {
	case "=":
		return 0
	case "^~":
		return 1
	}
	return 2
}

// quote makes an nginx string literal. Every value is validated before it
// gets here; quoting is a second line of defence, and a value that could
// still break out is refused loudly rather than written. '\\' and '$' are
// allowed only in the server_name regexes Render builds itself ("~...").
func quote(s string) string {
	bad := "\"';{}#\r\n\t\x00 "
	if !strings.HasPrefix(s, "~") {
		bad += "\\$"
	}
	if strings.ContainsAny(s, bad) {
		panic(fmt.Sprintf("ingress: unsafe value %q reached the template", s))
	}
	return `"` + s + `"`
}

// comment keeps a comment on its line.
func comment(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}

var confTemplate = template.Must(template.New("nginx.conf").Funcs(template.FuncMap{"q": quote, "c": comment}).Parse(`# Written by steelyard; every change is overwritten.
worker_processes {{.S.WorkerProcesses}};
daemon off;
master_process on;
pid {{q (printf "%s/nginx.pid" .Opts.Dir)}};
error_log stderr notice;

events {
    worker_connections {{.S.WorkerConnections}};
}

http {
    access_log off;
    server_tokens off;
    server_names_hash_bucket_size 128;
    keepalive_timeout {{.S.KeepaliveTimeout}};
    client_body_temp_path {{q (printf "%s/client_body_temp" .Opts.Dir)}};
    proxy_temp_path {{q (printf "%s/proxy_temp" .Opts.Dir)}};
    fastcgi_temp_path {{q (printf "%s/fastcgi_temp" .Opts.Dir)}};
    uwsgi_temp_path {{q (printf "%s/uwsgi_temp" .Opts.Dir)}};
    scgi_temp_path {{q (printf "%s/scgi_temp" .Opts.Dir)}};

    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header Host $host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto $scheme;
    proxy_connect_timeout {{.S.ProxyConnectTimeout}};
    proxy_read_timeout {{.S.ProxyReadTimeout}};
    proxy_send_timeout {{.S.ProxySendTimeout}};
{{range .Upstreams}}
    # {{c .Source}}
    upstream {{.Name}} {
{{- range .Servers}}
        server {{.}};
{{- end}}
{{- if gt $.S.UpstreamKeepalive 0}}
        keepalive {{$.S.UpstreamKeepalive}};
{{- end}}
    }
{{end}}
{{- with .Default}}
    server {
        listen {{$.Opts.HTTPPort}} default_server;
{{- if $.AnyTLS}}
        listen {{$.Opts.HTTPSPort}} ssl default_server;
        ssl_reject_handshake on;
{{- end}}
        server_name _;
{{- template "locations" .}}
    }
{{- end}}
{{- range .Servers}}

    server {
        listen {{$.Opts.HTTPPort}};
{{- if .Cert}}
        listen {{$.Opts.HTTPSPort}} ssl;
        ssl_certificate {{q .Cert}};
        ssl_certificate_key {{q .Cert}};
{{- end}}
        server_name {{q .ServerName}};
{{- template "locations" .}}
    }
{{- end}}
{{- if .Gateway}}

    # Gateway API HTTPRoutes
{{- .Gateway}}
{{- end}}
}
{{define "locations"}}
{{- range .Locations}}
        location {{if .Match}}{{.Match}} {{end}}{{q .Path}} {
            # {{c .Source}}
{{- if .Upstream}}
            proxy_pass http://{{.Upstream}};
{{- else}}
            return {{.Status}};
{{- end}}
        }
{{- end}}
{{- end}}
`))
