//go:build ingress

package ingress

import (
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/steelyard-net/steelyard/test/ingress/harness"
)

// TestInjection: Ingresses and ConfigMap values carrying nginx syntax (";",
// "{", "}", newlines, "$", quotes) as the API server accepts them never
// reach nginx.conf: each offending Ingress is skipped with a Warning Event,
// every bad ConfigMap key is reported and keeps its default, the good
// Ingress keeps being served, and nginx -t never rejects a config
// steelyard swapped in (no reload failure).
func TestInjection(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	addPods(t, w, map[string]string{"p0": "198.19.7.2"})
	must(t, w.Service(ctx, "s0", "198.18.1.40", nil))
	must(t, w.SetEndpoints(ctx, "s0", "p0"))
	good := hostile("good", "good.example", "/", prefix)
	good.Annotations = map[string]string{
		"nginx.ingress.kubernetes.io/configuration-snippet": "return 200 pwned-annotation;",
		"nginx.ingress.kubernetes.io/server-snippet":        "}\nserver { listen 81; }",
		"steelyard.io/anything":                             "$host;{}\"'\n",
	}
	must(t, w.Apply(ctx, good))
	payloads := []string{
		"/x;return 200 pwned0;",
		"/x{return 200 pwned1;}",
		"/x}",
		"/x\nreturn 200 pwned3;",
		"/x$host",
		`/x";return 200 pwned5;"`,
		"/x';return 200 pwned6;'",
		"/x return 200 pwned7",
		"/x#pwned8",
		`/x\";pwned9`,
	}
	var accepted []string
	for i, p := range payloads {
		for _, typ := range []networkingv1.PathType{implSp, prefix} {
			name := fmt.Sprintf("evil%d-%s", i, strings.ToLower(string(typ))[:4])
			err := w.Apply(ctx, hostile(name, fmt.Sprintf("evil%d.example", i), p, typ))
			if err != nil {
				t.Logf("API server refused path %q (%s): %v", p, typ, firstLine(err.Error()))
				continue
			}
			accepted = append(accepted, name)
		}
	}
	if len(accepted) == 0 {
		t.Fatal("the API server refused every payload: nothing tested")
	}
	t.Logf("%d hostile Ingresses accepted by the API server: %v", len(accepted), accepted)
	must(t, w.Settings(ctx, map[string]string{
		"worker-processes":   "1; user root",
		"worker-connections": "1024;\n}",
		"keepalive-timeout":  "30s; return 200 pwned-cm",
		"proxy-read-timeout": "${x}",
		"server-snippet":     "listen 81;",
	}))
	startAgent(t, w)
	eventually(t, 20*time.Second, "good.example served", func() string {
		if got := answer(w.Get("good.example", "/", nil)); got != "p0" {
			return got
		}
		return ""
	})
	eventually(t, 20*time.Second, "a Warning Event per hostile Ingress", func() string {
		var missing []string
		for _, name := range accepted {
			evs, err := w.Events(ctx, "Ingress", name)
			if err != nil {
				return err.Error()
			}
			if !strings.Contains(strings.Join(evs, "\n"), "Warning InvalidIngress: skipped: path") {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Sprint("no InvalidIngress event for ", missing)
		}
		return ""
	})
	eventually(t, 20*time.Second, "Warning Events for the ConfigMap", func() string {
		evs, err := w.Events(ctx, "ConfigMap", "nginx-settings")
		if err != nil {
			return err.Error()
		}
		if n := strings.Count(strings.Join(evs, "\n"), "Warning InvalidConfig"); n != 5 {
			return fmt.Sprintf("%d InvalidConfig events, want 5: %v", n, evs)
		}
		return ""
	})
	conf, err := w.Conf()
	must(t, err)
	for _, s := range []string{"pwned", "listen 81", "user root", "${x}", "evil"} {
		if strings.Contains(conf, s) {
			t.Errorf("%q reached nginx.conf", s)
		}
	}
	for i := range payloads {
		host := fmt.Sprintf("evil%d.example", i)
		if got := answer(w.Get(host, "/x", nil)); got != "404" {
			t.Errorf("%s/x -> %s, want 404 (its Ingress is skipped)", host, got)
		}
	}
	if got := metric(t, w, "steelyard_ingress_nginx_reload_failures_total"); got != 0 {
		t.Errorf("%v configs failed nginx -t", got)
	}
	if got := metric(t, w, "steelyard_ingress_invalid_objects"); got < float64(len(accepted)+5) {
		t.Errorf("steelyard_ingress_invalid_objects %v, want at least %d", got, len(accepted)+5)
	}
}

func hostile(name, host, path string, typ networkingv1.PathType) *networkingv1.Ingress {
	return harness.IngressOf(name, harness.Rule{Host: host, Paths: []harness.Path{{Path: path, Type: typ, Service: "s0"}}})
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
