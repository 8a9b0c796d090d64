package ingress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestSelected(t *testing.T) {
	class := func(name, controller string, isDefault bool) *networkingv1.IngressClass {
		c := &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.IngressClassSpec{Controller: controller}}
		if isDefault {
			c.Annotations = map[string]string{networkingv1.AnnotationIsDefaultIngressClass: "true"}
		}
		return c
	}
	ing := func(className *string, annotation string) *networkingv1.Ingress {
		i := &networkingv1.Ingress{Spec: networkingv1.IngressSpec{IngressClassName: className}}
		if annotation != "" {
			i.Annotations = map[string]string{annotationIngressClass: annotation}
		}
		return i
	}
	ours := class("steelyard", ControllerName, false)
	oursDefault := class("steelyard", ControllerName, true)
	other := class("nginx", "k8s.io/ingress-nginx", true)
	for _, tc := range []struct {
		name    string
		ing     *networkingv1.Ingress
		classes []*networkingv1.IngressClass
		only    string
		want    bool
	}{
		{"our class", ing(ptr.To("steelyard"), ""), []*networkingv1.IngressClass{ours, other}, "", true},
		{"other class", ing(ptr.To("nginx"), ""), []*networkingv1.IngressClass{ours, other}, "", false},
		{"unknown class", ing(ptr.To("nope"), ""), []*networkingv1.IngressClass{ours}, "", false},
		{"no class, ours not default", ing(nil, ""), []*networkingv1.IngressClass{ours, other}, "", false},
		{"no class, ours default", ing(nil, ""), []*networkingv1.IngressClass{oursDefault}, "", true},
		{"annotation ours", ing(nil, "steelyard"), []*networkingv1.IngressClass{ours}, "", true},
		{"annotation other, ours default", ing(nil, "nginx"), []*networkingv1.IngressClass{oursDefault, other}, "", false},
		{"--ingress-class limits", ing(ptr.To("steelyard"), ""), []*networkingv1.IngressClass{ours}, "internal", false},
		{"class naming another controller", ing(ptr.To("nginx"), ""), []*networkingv1.IngressClass{other}, "nginx", false},
	} {
		if got := Selected(tc.ing, tc.classes, tc.only); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestApply checks the swap without running nginx: the first config is
// written, the same text is not applied again, and a config nginx -t
// rejects is counted and leaves the running file alone.
func TestApply(t *testing.T) {
	bin := nginxBinary()
	if bin == "" {
		t.Skip("nginx not installed (scripts/install-deps.sh installs it)")
	}
	dir := t.TempDir()
	n, err := NewNginx(bin, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	prefix, extra, ok := privateNetns(t)
	if !ok {
		t.Skip("no private network namespace for nginx -t")
	}
	n.wrap, n.testArgs = prefix, extra
	in := goldenInput()
	crt, key := selfSigned(t, "shop.example")
	in.Secrets = map[string]*corev1.Secret{"shop/tls": tlsSecret("shop", "tls", crt, key)}
	in.Ingresses[0].Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"shop.example"}, SecretName: "tls"}}
	out := Render(in, Options{Dir: n.Dir})
	if _, err := n.Apply(out); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(n.ConfPath())
	if err != nil || string(got) != out.Text {
		t.Fatalf("nginx.conf not written: %v", err)
	}
	for name := range out.Certs {
		st, err := os.Stat(filepath.Join(dir, "certs", name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("certificate file mode %v, want 0600", st.Mode().Perm())
		}
	}
	if reloaded, err := n.Apply(Render(in, Options{Dir: n.Dir})); err != nil || reloaded {
		t.Errorf("same text applied again: reloaded %v, %v", reloaded, err)
	}
	bad := Output{Text: strings.Replace(out.Text, "worker_connections", "worker_connexions", 1)}
	if _, err := n.Apply(bad); err == nil {
		t.Fatal("a config nginx -t rejects was applied")
	}
	if got := value(n.Metrics.ReloadFailures); got != 1 {
		t.Errorf("reload failures %v, want 1", got)
	}
	if now, _ := os.ReadFile(n.ConfPath()); string(now) != out.Text {
		t.Error("a rejected config replaced nginx.conf")
	}
	if got := value(n.Metrics.Reloads); got != 0 {
		t.Errorf("reloads %v, want 0 (nginx is not running)", got)
	}
	// Left-over temporary files would pile up.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "nginx.conf.new") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// value reads a counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
