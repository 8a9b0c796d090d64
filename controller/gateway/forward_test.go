package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

// tlsSecret returns a kubernetes.io/tls Secret with a fresh self-signed
// certificate.
func tlsSecret(t *testing.T, namespace, name string) *corev1.Secret {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})}}
}

// TestHTTPListenerForwards: the address and port of each valid HTTP and
// HTTPS listener become a Service port whose one backend is this node's
// address at the listener's nginx port (one per Gateway and port, oldest
// Gateway first, so two Gateways on port 80 stay apart in nginx), and the
// HTTPRoutes are rendered on that port. The dataplanes (iptables fake read
// back by its rule parser, IPVS fake) send all of the listener's
// connections to the node's nginx port; the conformance suite found that
// nothing reached nginx without it.
func TestHTTPListenerForwards(t *testing.T) {
	parent := gwv1.ParentReference{Name: "one"}
	in := Input{
		Classes: []*gwv1.GatewayClass{class()},
		Gateways: []*gwv1.Gateway{
			gw("one", 0, gwv1.Listener{Name: "http", Protocol: gwv1.HTTPProtocolType, Port: 80},
				gwv1.Listener{Name: "http-b", Protocol: gwv1.HTTPProtocolType, Port: 80, Hostname: ptr.To(gwv1.Hostname("b.example"))},
				gwv1.Listener{Name: "https", Protocol: gwv1.HTTPSProtocolType, Port: 443, TLS: &gwv1.ListenerTLSConfig{
					CertificateRefs: []gwv1.SecretObjectReference{{Name: "cert"}}}},
				gwv1.Listener{Name: "bad-tls", Protocol: gwv1.HTTPSProtocolType, Port: 8443, TLS: &gwv1.ListenerTLSConfig{
					CertificateRefs: []gwv1.SecretObjectReference{{Name: "nonexistent"}}}}),
			gw("two", 1, gwv1.Listener{Name: "http", Protocol: gwv1.HTTPProtocolType, Port: 80}),
		},
		HTTPRoutes: []*gwv1.HTTPRoute{httpRoute("r", 0, nil, parent, backendRef("s1", 1))},
		Services:   []*corev1.Service{svc("s1", "198.18.0.1", nil)},
		Secrets:    []*corev1.Secret{tlsSecret(t, ns, "cert")},
		NodeAddrs:  []netip.Addr{netip.MustParseAddr("2001:2::5"), netip.MustParseAddr("198.19.0.5")},
		Pool:       netip.MustParsePrefix("198.18.200.0/29"),
		HTTP:       true,
	}
	res := Translate(in)
	got := map[string]string{}
	for _, l := range res.Routes.Listeners {
		if len(l.Local) != 1 {
			t.Fatalf("%s: backends %+v, want one local", l.Name, l.Local)
		}
		got[netip.AddrPortFrom(l.VIP.IP, l.VIP.Port).String()] = l.Local[0].Addr().String()
	}
	want := map[string]string{
		"198.18.200.1:80":  "198.19.0.5:61000",
		"198.18.200.1:443": "198.19.0.5:61001",
		// bad-tls is not Programmed: no forward, but it keeps its port.
		"198.18.200.2:80": "198.19.0.5:61003",
	}
	if len(got) != len(want) {
		t.Errorf("forwards %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("forward %s -> %s, want %s", k, got[k], v)
		}
	}
	if len(res.HTTP) != 1 {
		t.Fatalf("HTTP %+v", res.HTTP)
	}
	ports := map[string]int32{}
	for _, at := range res.HTTP[0].Attach {
		ports[at.Listener] = at.ListenPort
		if at.Port != 80 && at.Port != 443 {
			t.Errorf("%s: listener port %d", at.Listener, at.Port)
		}
	}
	if ports[ns+"/one/http"] != 61000 || ports[ns+"/one/http-b"] != 61000 || ports[ns+"/one/https"] != 61001 {
		t.Errorf("nginx ports of the attachments %v", ports)
	}

	b := controller.NewBuilder()
	b.SetRoutes(res.Routes)
	st, _ := b.Build(in.Services, nil)
	shares := map[string]map[string]float64{
		"198.18.200.1:80": {"198.19.0.5": 100}, "198.18.200.1:443": {"198.19.0.5": 100}, "198.18.200.2:80": {"198.19.0.5": 100},
	}
	ipt := iptables.NewProxier(iptables.NewFake(), iptables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}})
	check(t, "iptables", ipt, st, shares)
	check(t, "ipvs", newIPVS(t, dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17")}}), st, shares)
	for _, sp := range st.Services {
		if sp.Name.Name == "one" || sp.Name.Name == "two" {
			if len(sp.Backends) != 1 || sp.Backends[0].Port < 61000 {
				t.Errorf("%s: backends %+v", sp.Name, sp.Backends)
			}
		}
	}
}
