//go:build ingress

package ingress

import (
	"fmt"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/test/ingress/harness"
)

const (
	exact  = networkingv1.PathTypeExact
	prefix = networkingv1.PathTypePrefix
	implSp = networkingv1.PathTypeImplementationSpecific
)

// TestRouting: host and path routing through a real nginx. Each example of
// the Ingress spec's path-matching table gets its own host with one Ingress
// per path (so the longest match must win across Ingresses); then
// wildcard and host-less rules; then a defaultBackend takes over what
// matched nothing (404 before). The request must reach the pod of the
// Service the spec names.
func TestRouting(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	addPods(t, w, map[string]string{"p0": "198.19.3.2", "p1": "198.19.3.3", "p2": "198.19.3.4", "fallback": "198.19.3.5"})
	for i, name := range []string{"s0", "s1", "s2", "fallback"} {
		must(t, w.Service(ctx, name, fmt.Sprintf("198.18.1.%d", 10+i), nil))
		pod := strings.Replace(name, "s", "p", 1)
		if name == "fallback" {
			pod = name
		}
		must(t, w.SetEndpoints(ctx, name, pod))
	}
	startAgent(t, w)

	type path struct {
		p   string
		typ networkingv1.PathType
	}
	// The spec's examples (https://kubernetes.io/docs/concepts/services-networking/ingress/#examples);
	// want is the index of the path that serves the request (its Service
	// s<i>, pod p<i>), or -1 for none (404).
	cases := []struct {
		paths []path
		req   string
		want  int
	}{
		{[]path{{"/", prefix}}, "/anything/at/all", 0},
		{[]path{{"/foo", exact}}, "/foo", 0},
		{[]path{{"/foo", exact}}, "/bar", -1},
		{[]path{{"/foo", exact}}, "/foo/", -1},
		{[]path{{"/foo/", exact}}, "/foo", -1},
		{[]path{{"/", prefix}, {"/foo/", exact}}, "/foo", 0}, // no 301 to /foo/
		{[]path{{"/foo", prefix}}, "/foo", 0},
		{[]path{{"/foo", prefix}}, "/foo/", 0},
		{[]path{{"/foo/", prefix}}, "/foo", 0},
		{[]path{{"/foo/", prefix}}, "/foo/", 0},
		{[]path{{"/aaa/bb", prefix}}, "/aaa/bbb", -1},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb", 0},
		{[]path{{"/aaa/bbb/", prefix}}, "/aaa/bbb", 0},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb/", 0},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbb/ccc", 0},
		{[]path{{"/aaa/bbb", prefix}}, "/aaa/bbbxyz", -1},
		{[]path{{"/", prefix}, {"/aaa", prefix}}, "/aaa/ccc", 1},
		{[]path{{"/", prefix}, {"/aaa", prefix}, {"/aaa/bbb", prefix}}, "/aaa/bbb", 2},
		{[]path{{"/", prefix}, {"/aaa", prefix}, {"/aaa/bbb", prefix}}, "/ccc", 0},
		{[]path{{"/aaa", prefix}}, "/ccc", -1},
		{[]path{{"/foo", prefix}, {"/foo", exact}}, "/foo", 1},
		{[]path{{"/foo", prefix}, {"/foo", exact}}, "/foo/x", 0},
		{[]path{{"/foo", implSp}}, "/foo/bar", 0},
		{[]path{{"/foo", implSp}}, "/foobar", -1},
	}
	host := func(i int) string { return fmt.Sprintf("case%d.example", i) }
	for i, tc := range cases {
		for j, p := range tc.paths {
			must(t, w.Apply(ctx, harness.IngressOf(fmt.Sprintf("case%d-%d", i, j),
				harness.Rule{Host: host(i), Paths: []harness.Path{{Path: p.p, Type: p.typ, Service: fmt.Sprintf("s%d", j)}}})))
		}
	}
	must(t, w.Apply(ctx, harness.IngressOf("hosts",
		harness.Rule{Host: "*.wild.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "s2"}}},
		harness.Rule{Host: "", Paths: []harness.Path{{Path: "/ping", Type: exact, Service: "s1"}}},
	)))
	type req struct{ host, path, want string }
	var reqs []req
	for i, tc := range cases {
		want := "404"
		if tc.want >= 0 {
			want = fmt.Sprintf("p%d", tc.want)
		}
		reqs = append(reqs, req{host(i), tc.req, want})
	}
	reqs = append(reqs,
		req{"a.wild.example", "/x", "p2"},
		req{"a.b.wild.example", "/x", "404"}, // a wildcard covers one label
		req{"wild.example", "/x", "404"},
		req{"unknown.example", "/ping", "p1"}, // host-less rule
		req{"unknown.example", "/other", "404"},
	)
	check := func(phase string, reqs []req) {
		t.Helper()
		eventually(t, 20*time.Second, phase, func() string {
			var bad []string
			for _, r := range reqs {
				if got := answer(w.Get(r.host, r.path, nil)); got != r.want {
					bad = append(bad, fmt.Sprintf("%s%s -> %s, want %s", r.host, r.path, got, r.want))
				}
			}
			return strings.Join(bad, "; ")
		})
		t.Logf("%s: %d requests reached the expected pod (or 404)", phase, len(reqs))
	}
	check("spec table and hosts", reqs)

	// A real change reloads nginx exactly once; then a defaultBackend
	// serves what no rule matched.
	time.Sleep(time.Second) // let the last renders settle
	reloads := metric(t, w, "steelyard_ingress_nginx_reloads_total")
	hash := metric(t, w, "steelyard_ingress_nginx_config_hash")
	fb := &networkingv1.Ingress{}
	fb.Name = "fallback"
	fb.Spec.DefaultBackend = ptr.To(harness.Backend("fallback"))
	must(t, w.Apply(ctx, fb))
	var after []req
	for _, r := range reqs {
		if r.want == "404" {
			r.want = "fallback"
		}
		after = append(after, r)
	}
	check("with a defaultBackend", after)
	time.Sleep(time.Second)
	if got := metric(t, w, "steelyard_ingress_nginx_reloads_total"); got != reloads+1 {
		t.Errorf("adding one Ingress: %v reloads, want 1", got-reloads)
	}
	if got := metric(t, w, "steelyard_ingress_nginx_config_hash"); got == hash {
		t.Error("config hash metric did not change")
	}
	if got := metric(t, w, "steelyard_ingress_nginx_reload_failures_total"); got != 0 {
		t.Errorf("%v reload failures", got)
	}
	t.Logf("reloads during the test: %v", metric(t, w, "steelyard_ingress_nginx_reloads_total"))
}
