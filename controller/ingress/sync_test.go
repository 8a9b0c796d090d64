package ingress

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
)

// syncFixture is the API content of TestControllerSync: our class, an
// Ingress of it, an invalid one, one of another class, a Service with a
// slice, and a settings ConfigMap with one unknown key.
func syncFixture() []runtime.Object {
	ours := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "steelyard"}, Spec: networkingv1.IngressClassSpec{Controller: ControllerName}}
	other := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}}
	good := makeIngress("app", "good", 1, func(i *networkingv1.Ingress) {
		i.Spec.IngressClassName = ptr.To("steelyard")
		i.Spec.Rules = []networkingv1.IngressRule{rule("app.example", pathSpec{"/", prefix, "web"})}
	})
	bad := makeIngress("app", "bad", 2, func(i *networkingv1.Ingress) {
		i.Spec.IngressClassName = ptr.To("steelyard")
		i.Spec.Rules = []networkingv1.IngressRule{rule("bad.example", pathSpec{"/x;return 200 x;", implSp, "web"})}
	})
	foreign := makeIngress("app", "foreign", 3, func(i *networkingv1.Ingress) {
		i.Spec.IngressClassName = ptr.To("nginx")
		i.Spec.Rules = []networkingv1.IngressRule{rule("foreign.example", pathSpec{"/", prefix, "web"})}
	})
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		Ports:      []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints:  []discoveryv1.Endpoint{{Addresses: []string{"198.19.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "cfg", Name: "nginx"}, Data: map[string]string{"worker-connections": "2048", "snippet": "x"}}
	unrelated := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "cfg", Name: "other"}, Data: map[string]string{"worker-connections": "99"}}
	return []runtime.Object{ours, other, good, bad, foreign, makeService("app", "web", "198.18.0.50"), slice, cm, unrelated}
}

// TestControllerSync drives the controller over a fake API (informers,
// class selection, ConfigMap, Events) and the supervisor's swap (nginx -t
// in a private network namespace; nginx itself is not started).
func TestControllerSync(t *testing.T) {
	bin := nginxBinary()
	if bin == "" {
		t.Skip("nginx not installed (scripts/install-deps.sh installs it)")
	}
	prefix, extra, ok := privateNetns(t)
	if !ok {
		t.Skip("no private network namespace for nginx -t")
	}
	for _, mode := range []string{UpstreamsVIP, UpstreamsPods} {
		t.Run(mode, func(t *testing.T) {
			client := fake.NewClientset(syncFixture()...)
			n, err := NewNginx(bin, t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			n.wrap, n.testArgs = prefix, extra
			rec := record.NewFakeRecorder(100)
			c, err := New(client, Config{ConfigMap: "cfg/nginx", Render: Options{Upstreams: mode}}, n, rec, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			changes := make(chan struct{}, 1000)
			if err := c.startInformers(t.Context(), func() { changes <- struct{}{} }); err != nil {
				t.Fatal(err)
			}
			if err := c.Sync(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(n.ConfPath())
			if err != nil {
				t.Fatal(err)
			}
			conf := string(b)
			wantServer := "server 198.18.0.50:80;"
			if mode == UpstreamsPods {
				wantServer = "server 198.19.1.2:8080;"
			}
			for _, want := range []string{`server_name "app.example";`, wantServer, "worker_connections 2048;"} {
				if !strings.Contains(conf, want) {
					t.Errorf("nginx.conf lacks %q:\n%s", want, conf)
				}
			}
			for _, not := range []string{"foreign.example", "bad.example", "return 200 x"} {
				if strings.Contains(conf, not) {
					t.Errorf("nginx.conf has %q", not)
				}
			}
			events := drain(rec.Events)
			for _, want := range []string{"Warning InvalidIngress skipped: path", `Warning InvalidConfig unknown key "snippet"`} {
				if !strings.Contains(strings.Join(events, "\n"), want) {
					t.Errorf("no event %q in %v", want, events)
				}
			}
			// The same problems are not reported again.
			if err := c.Sync(); err != nil {
				t.Fatal(err)
			}
			if again := drain(rec.Events); len(again) != 0 {
				t.Errorf("events repeated: %v", again)
			}

			// An endpoint change: in VIP mode nothing is even watched; in
			// pods mode the text changes.
			drainSignals(changes)
			sl, err := client.DiscoveryV1().EndpointSlices("app").Get(t.Context(), "web-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"198.19.1.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
			if _, err := client.DiscoveryV1().EndpointSlices("app").Update(t.Context(), sl, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			got := drainSignals(changes)
			if mode == UpstreamsVIP && got != 0 {
				t.Errorf("VIP mode: an EndpointSlice change triggered %d syncs", got)
			}
			if mode == UpstreamsPods && got == 0 {
				t.Error("pods mode: an EndpointSlice change triggered no sync")
			}
			if err := c.Sync(); err != nil {
				t.Fatal(err)
			}
			b, _ = os.ReadFile(n.ConfPath())
			changed := string(b) != conf
			if changed != (mode == UpstreamsPods) {
				t.Errorf("%s mode: config changed after an endpoint change: %v", mode, changed)
			}
		})
	}
}

func drain(ch chan string) []string {
	var out []string
	for {
		select {
		case e := <-ch:
			out = append(out, e)
		default:
			return out
		}
	}
}

func drainSignals(ch chan struct{}) int {
	n := 0
	for {
		select {
		case <-ch:
			n++
		default:
			return n
		}
	}
}
