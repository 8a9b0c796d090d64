//go:build ingress

package ingress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/ingress/harness"
)

// selfSigned returns a certificate for host (PEM), its key, and a pool
// that trusts it.
func selfSigned(t *testing.T, host string) (crt, key []byte, pool *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host}, DNSNames: []string{host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	must(t, err)
	kder, err := x509.MarshalECPrivateKey(k)
	must(t, err)
	cert, err := x509.ParseCertificate(der)
	must(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), pool
}

func tlsSecret(t *testing.T, w *harness.World, name string, crt, key []byte) {
	t.Helper()
	_, err := w.Admin.CoreV1().Secrets(harness.Namespace).Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}, metav1.CreateOptions{})
	must(t, err)
}

// TestTLS: an Ingress whose Secret holds a certificate serves HTTPS with it,
// chosen by SNI; a malformed Secret and a missing one are reported as
// Warning Events while their hosts stay on plain HTTP and every other host
// keeps working; creating the missing Secret later turns HTTPS on for its
// host.
func TestTLS(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	addPods(t, w, map[string]string{"p0": "198.19.6.2", "p1": "198.19.6.3"})
	must(t, w.Service(ctx, "s0", "198.18.1.30", nil))
	must(t, w.Service(ctx, "s1", "198.18.1.31", nil))
	must(t, w.SetEndpoints(ctx, "s0", "p0"))
	must(t, w.SetEndpoints(ctx, "s1", "p1"))
	crt, key, pool := selfSigned(t, "secure.example")
	tlsSecret(t, w, "good", crt, key)
	tlsSecret(t, w, "garbage", []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"), key)
	ing := harness.IngressOf("tls",
		harness.Rule{Host: "secure.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "s0"}}},
		harness.Rule{Host: "broken.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "s0"}}},
		harness.Rule{Host: "absent.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "s0"}}},
	)
	ing.Spec.TLS = []networkingv1.IngressTLS{
		{Hosts: []string{"secure.example"}, SecretName: "good"},
		{Hosts: []string{"broken.example"}, SecretName: "garbage"},
		{Hosts: []string{"absent.example"}, SecretName: "absent"},
	}
	must(t, w.Apply(ctx, ing))
	must(t, w.Apply(ctx, harness.IngressOf("plain", harness.Rule{Host: "other.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "s1"}}})))
	startAgent(t, w)

	eventually(t, 20*time.Second, "HTTPS by SNI with the Secret's certificate", func() string {
		if got := answer(w.Get("secure.example", "/", tlsTo("secure.example", pool))); got != "p0" {
			return "https://secure.example/ -> " + got
		}
		return ""
	})
	for _, r := range []struct{ host, want string }{{"broken.example", "p0"}, {"absent.example", "p0"}, {"other.example", "p1"}, {"secure.example", "p0"}} {
		if got := answer(w.Get(r.host, "/", nil)); got != r.want {
			t.Errorf("http://%s/ -> %s, want %s", r.host, got, r.want)
		}
	}
	// No certificate for broken.example: the handshake is refused (the
	// catch-all server rejects unknown SNI) rather than served with
	// another host's certificate.
	if _, _, err := w.Get("broken.example", "/", &tls.Config{ServerName: "broken.example", InsecureSkipVerify: true}); err == nil {
		t.Error("https://broken.example/ answered without a valid certificate")
	} else {
		t.Logf("https://broken.example/: %v (expected)", err)
	}
	eventually(t, 10*time.Second, "Warning Events for the bad Secrets", func() string {
		evs, err := w.Events(ctx, "Ingress", "tls")
		if err != nil {
			return err.Error()
		}
		all := strings.Join(evs, "\n")
		if !strings.Contains(all, "Warning InvalidTLS: Secret ingress/garbage") || !strings.Contains(all, "Warning InvalidTLS: Secret ingress/absent not found") {
			return "events: " + all
		}
		t.Logf("events:\n%s", all)
		return ""
	})
	entries, err := os.ReadDir(filepath.Join(w.NginxDir, "certs"))
	must(t, err)
	for _, e := range entries {
		st, err := os.Stat(filepath.Join(w.NginxDir, "certs", e.Name()))
		must(t, err)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("certificate file %s has mode %v, want 0600", e.Name(), st.Mode().Perm())
		}
	}
	if len(entries) != 1 {
		t.Errorf("%d certificate files, want 1", len(entries))
	}

	// The missing Secret appears: its host gets HTTPS.
	crt2, key2, pool2 := selfSigned(t, "absent.example")
	tlsSecret(t, w, "absent", crt2, key2)
	eventually(t, 20*time.Second, "HTTPS for absent.example once its Secret exists", func() string {
		if got := answer(w.Get("absent.example", "/", tlsTo("absent.example", pool2))); got != "p0" {
			return "https://absent.example/ -> " + got
		}
		return ""
	})
	if got := answer(w.Get("secure.example", "/", tlsTo("secure.example", pool))); got != "p0" {
		t.Errorf("https://secure.example/ -> %s after the change", got)
	}
	if got := metric(t, w, "steelyard_ingress_nginx_reload_failures_total"); got != 0 {
		t.Errorf("%v reload failures", got)
	}
}

// tlsTo trusts pool for host.
func tlsTo(host string, pool *x509.CertPool) *tls.Config {
	return &tls.Config{ServerName: host, RootCAs: pool, MinVersion: tls.VersionTLS12}
}
