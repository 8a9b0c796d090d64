package ingress

import (
	"flag"
	"fmt"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"
)

// statement is one nginx directive: its enclosing block, name and number of
// arguments (a block's own name counts as a directive with "{").
type statement struct {
	parent, name string
	args         int
	block        bool
}

// lexConf splits an nginx configuration into statements the way nginx reads
// it (quoted strings with escapes, # comments, ; { }), independently of
// the renderer. It fails on unbalanced blocks, unterminated strings and a
// directive without its ";".
func lexConf(text string) ([]statement, error) {
	var out []statement
	var stack []string
	var words []string
	i := 0
	for i < len(text) {
		c := text[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			i++
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == ';' || c == '{':
			if len(words) == 0 {
				return nil, fmt.Errorf("offset %d: %q without a directive", i, c)
			}
			parent := strings.Join(stack, "/")
			out = append(out, statement{parent: parent, name: words[0], args: len(words) - 1, block: c == '{'})
			if c == '{' {
				stack = append(stack, words[0])
			}
			words = nil
			i++
		case c == '}':
			if len(words) != 0 || len(stack) == 0 {
				return nil, fmt.Errorf("offset %d: unexpected }", i)
			}
			stack = stack[:len(stack)-1]
			i++
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(text) && text[j] != c {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(text) {
				return nil, fmt.Errorf("offset %d: unterminated string", i)
			}
			words = append(words, text[i:j+1])
			i = j + 1
		default:
			j := i
			for j < len(text) && !strings.ContainsRune(" \t\r\n;{}\"'", rune(text[j])) {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			words = append(words, text[i:min(j, len(text))])
			i = j
		}
	}
	if len(words) != 0 || len(stack) != 0 {
		return nil, fmt.Errorf("unterminated directive or block at the end")
	}
	return out, nil
}

var (
	shapesOnce sync.Once
	shapes     map[statement]bool
	fuzzCrt    []byte
	fuzzKey    []byte
)

// knownShapes are the statements (context, directive, argument count) of
// the configurations the renderer makes from trusted inputs: the golden
// input in both upstream modes and a TLS host. A random Ingress may add
// servers, locations and upstreams of these shapes, nothing else.
func knownShapes(t *testing.T) map[statement]bool {
	shapesOnce.Do(func() {
		fuzzCrt, fuzzKey = selfSigned(t, "fuzz.example", "*.fuzz.example")
		shapes = map[statement]bool{}
		tls := goldenInput()
		tls.Secrets = map[string]*corev1.Secret{"shop/tls": tlsSecret("shop", "tls", fuzzCrt, fuzzKey)}
		tls.Ingresses[0].Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"shop.example"}, SecretName: "tls"}}
		for _, r := range []Output{
			Render(goldenInput(), Options{Dir: testDir}),
			Render(goldenInput(), Options{Dir: testDir, Upstreams: UpstreamsPods}),
			Render(tls, Options{Dir: testDir}),
		} {
			sts, err := lexConf(r.Text)
			if err != nil {
				t.Fatalf("golden render does not lex: %v", err)
			}
			for _, s := range sts {
				shapes[s] = true
			}
		}
	})
	return shapes
}

// FuzzRender renders a random Ingress (namespace, name, host, path, path
// type, backend Service and port, TLS host and Secret) beside a good one:
// never a panic; the text lexes as nginx reads it and holds only statements
// of the shapes trusted inputs produce (so no directive, block or argument
// from the input); the good Ingress is still served. Seed inputs (not
// fuzzing) also go through `nginx -t` when nginx is installed.
func FuzzRender(f *testing.F) {
	for _, s := range []struct {
		ns, name, host, path    string
		pathType                uint8
		svc, portName           string
		portNum                 int32
		tlsHost, secret         string
		defaultBackend, withSvc bool
	}{
		{"fuzz", "a", "fuzz.example", "/", 1, "web", "", 80, "fuzz.example", "tls", false, true},
		{"fuzz", "b", "*.fuzz.example", "/api/", 0, "web", "http", 0, "*.fuzz.example", "tls", true, true},
		{"fuzz", "c", "", "/x", 2, "missing", "", 8080, "", "", true, false},
		{"fuzz", "d", "fuzz.example", "/x;return 200 pwned;", 1, "web", "", 80, "", "", false, true},
		{"fuzz", "e", "fuzz.example\nlisten 81", "/", 1, "web", "", 80, "", "", false, true},
		{"fuzz", "f", "fuzz.example", "/", 1, "web}", "http", 0, "fuzz.example", "s;", false, true},
		{"fu\"zz", "g", "fuzz.example", "/a b", 3, "web", "", 80, "", "", false, true},
		{"fuzz", "h", "FUZZ.example", "/%3b", 1, "web", "$x", 0, "", "", false, true},
		{"fuzz", "i", "fuzz.example", "/ok/../etc", 0, "web", "", 65536, "", "", false, true},
		{"fuzz", "j", "a.fuzz.example", "/\\", 1, "web", "", -1, "a.fuzz.example", "tls", true, true},
	} {
		f.Add(s.ns, s.name, s.host, s.path, s.pathType, s.svc, s.portName, s.portNum, s.tlsHost, s.secret, s.defaultBackend, s.withSvc)
	}
	fuzzing := flag.Lookup("test.fuzz").Value.String() != ""
	f.Fuzz(func(t *testing.T, ns, name, host, path string, pathType uint8, svcName, portName string, portNum int32, tlsHost, secret string, defaultBackend, withSvc bool) {
		known := knownShapes(t)
		good := makeIngress("ok", "good", 0, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{rule("good.example", pathSpec{"/", prefix, "web"})}
		})
		backend := networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svcName, Port: networkingv1.ServiceBackendPort{Name: portName, Number: portNum}}}
		pt := []*networkingv1.PathType{nil, prefix, exact, implSp, ptr.To(networkingv1.PathType(path))}[int(pathType)%5]
		evil := makeIngress(ns, name, 1, func(i *networkingv1.Ingress) {
			i.Spec.Rules = []networkingv1.IngressRule{{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Path: path, PathType: pt, Backend: backend}},
			}}}}
			if defaultBackend {
				i.Spec.DefaultBackend = &backend
			}
			if tlsHost != "" || secret != "" {
				i.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{tlsHost}, SecretName: secret}}
			}
		})
		svcs := services(makeService("ok", "web", "198.18.0.20"))
		if withSvc {
			port := corev1.ServicePort{Name: portName, Port: portNum, Protocol: corev1.ProtocolTCP}
			if portNum <= 0 {
				port.Port = 80
			}
			svcs[ns+"/"+svcName] = makeService(ns, svcName, "198.18.0.21", port)
		}
		in := Input{
			Ingresses: []*networkingv1.Ingress{good, evil},
			Services:  svcs,
			Secrets:   map[string]*corev1.Secret{ns + "/" + secret: tlsSecret(ns, secret, fuzzCrt, fuzzKey)},
			Settings:  DefaultSettings(),
		}
		out := Render(in, Options{Dir: testDir})
		sts, err := lexConf(out.Text)
		if err != nil {
			t.Fatalf("rendered text does not lex: %v\n%s", err, out.Text)
		}
		for _, s := range sts {
			if !known[s] {
				t.Fatalf("statement %+v is of no known shape: input reached the config?\n%s", s, out.Text)
			}
		}
		if !strings.Contains(out.Text, `server_name "good.example";`) {
			t.Fatalf("the good Ingress is no longer served:\n%s", out.Text)
		}
		if !fuzzing {
			nginxTest(t, out)
		}
	})
}

// FuzzSettings renders the golden input with random ConfigMap values for
// every known key: never a panic; the text lexes and holds only known
// statement shapes (a value never adds a directive or an argument); a bad
// value is reported and keeps its default. Seeds (edge values of each
// range) also go through `nginx -t` when not fuzzing.
func FuzzSettings(f *testing.F) {
	for _, v := range [][7]string{
		{"auto", "16384", "64", "75s", "5s", "60s", "60s"},
		{"1", "16", "0", "0", "0ms", "0", "0s"},
		{"64", "65535", "1024", "999999h", "999999ms", "999999m", "1h"},
		{"65", "15", "1025", "1d", "5s;", "60s return 200", "-1s"},
		{"+8", "0x10", " 64", "75S", "\n", "", "60s\x00"},
	} {
		f.Add(v[0], v[1], v[2], v[3], v[4], v[5], v[6])
	}
	fuzzing := flag.Lookup("test.fuzz").Value.String() != ""
	f.Fuzz(func(t *testing.T, wp, wc, ka, kt, pct, prt, pst string) {
		known := knownShapes(t)
		data := map[string]string{}
		for i, v := range []string{wp, wc, ka, kt, pct, prt, pst} {
			if v != "" {
				data[SettingKeys[i]] = v
			}
		}
		s, errs := ParseSettings(data)
		in := goldenInput()
		in.Settings = s
		out := Render(in, Options{Dir: testDir})
		sts, err := lexConf(out.Text)
		if err != nil {
			t.Fatalf("rendered text does not lex: %v\n%s", err, out.Text)
		}
		for _, st := range sts {
			if !known[st] {
				t.Fatalf("statement %+v is of no known shape (settings %q, errors %v):\n%s", st, data, errs, out.Text)
			}
		}
		if !fuzzing {
			nginxTest(t, out)
		}
	})
}
