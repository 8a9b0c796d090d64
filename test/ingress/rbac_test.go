//go:build ingress

package ingress

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/test/ingress/harness"
)

var manifestsDir = filepath.Join("..", "..", "manifests")

// TestRBAC: with manifests/ (Namespace, RBAC) and manifests/ingress/
// (the ingress ClusterRole, IngressClass, settings ConfigMap) applied, an
// agent holding only the steelyard ServiceAccount's token serves an Ingress
// over HTTPS from a TLS Secret, reads the settings ConfigMap, and records
// Events, without any Forbidden in its log.
func TestRBAC(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, w.CP.Binaries.Kubectl, append([]string{"--kubeconfig", w.CP.Kubeconfig}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, f := range []string{"00-namespace.yaml", "10-rbac.yaml", "ingress"} {
		t.Logf("kubectl apply -f manifests/%s:\n%s", f, kubectl("apply", "-f", filepath.Join(manifestsDir, f)))
	}
	tr, err := w.Admin.CoreV1().ServiceAccounts("steelyard").CreateToken(ctx, "steelyard", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	must(t, err)
	kubeconfig, err := w.CP.TokenKubeconfig(tr.Status.Token)
	must(t, err)
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	must(t, err)
	sa, err := kubernetes.NewForConfig(cfg)
	must(t, err)
	// The authorizer learns of new bindings through an informer.
	eventually(t, 10*time.Second, "the ClusterRoleBindings in force", func() string {
		if _, err := sa.NetworkingV1().Ingresses("").List(context.Background(), metav1.ListOptions{Limit: 1}); err != nil {
			return err.Error()
		}
		if _, err := sa.CoreV1().Services("").List(context.Background(), metav1.ListOptions{Limit: 1}); err != nil {
			return err.Error()
		}
		return ""
	})

	addPods(t, w, map[string]string{"a1": "198.19.10.2"})
	must(t, w.Service(ctx, "app", "198.18.1.70", nil))
	must(t, w.SetEndpoints(ctx, "app", "a1"))
	crt, key, pool := selfSigned(t, "rbac.example")
	tlsSecret(t, w, "rbac-tls", crt, key)
	ing := harness.IngressOf("rbac",
		harness.Rule{Host: "rbac.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "app"}}},
		harness.Rule{Host: "nocert.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "app"}}})
	ing.Spec.TLS = []networkingv1.IngressTLS{{Hosts: []string{"rbac.example"}, SecretName: "rbac-tls"}, {Hosts: []string{"nocert.example"}, SecretName: "missing"}}
	must(t, w.Apply(ctx, ing))
	startAgent(t, w, "--kubeconfig", kubeconfig, "--ingress-configmap", "steelyard/steelyard-ingress-nginx")
	eventually(t, 20*time.Second, "HTTPS with the Secret read under the ServiceAccount", func() string {
		if got := answer(w.Get("rbac.example", "/", tlsTo("rbac.example", pool))); got != "a1" {
			return got
		}
		return ""
	})
	eventually(t, 15*time.Second, "an InvalidTLS Event recorded by the ServiceAccount", func() string {
		evs, err := w.Events(ctx, "Ingress", "rbac")
		if err != nil {
			return err.Error()
		}
		if !strings.Contains(strings.Join(evs, "\n"), "InvalidTLS") {
			return fmt.Sprint(evs)
		}
		return ""
	})
	conf, err := w.Conf()
	must(t, err)
	if !strings.Contains(conf, "worker_connections 16384;") {
		t.Error("the settings ConfigMap of manifests/ingress was not applied")
	}
	if log := w.Agent.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		var lines []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(strings.ToLower(l), "forbidden") {
				lines = append(lines, l)
			}
		}
		t.Errorf("the agent was refused something:\n%s", strings.Join(lines, "\n"))
	}
}
