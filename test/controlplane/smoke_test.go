//go:build k8s

package controlplane

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// Test objects. The ClusterIP comes from ServiceClusterIPRange; the
// endpoint addresses are in the sandbox's pod range (198.19.1.0/24).
const (
	smokeNS      = "smoke"
	smokeSvc     = "web"
	smokeManager = "steelyard-test"
)

// TestSmoke runs a control plane with every default API and with
// WithReducedAPIs.
func TestSmoke(t *testing.T) {
	t.Run("full", func(t *testing.T) { smoke(t) })
	t.Run("reduced", func(t *testing.T) { smoke(t, WithReducedAPIs()) })
}

func smoke(t *testing.T, opts ...Option) {
	ctx := t.Context()
	t0 := time.Now()
	cp := Start(t, opts...)
	t.Logf("start-up time: %v", time.Since(t0).Round(time.Millisecond))
	c := cp.Client()

	v, err := c.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("/version: %v", err)
	}
	if v.GitVersion != KubernetesVersion {
		t.Fatalf("/version says %q, want %q", v.GitVersion, KubernetesVersion)
	}

	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: smokeNS},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services(smokeNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: smokeSvc},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !netip.MustParsePrefix(ServiceClusterIPRange).Contains(vip) {
		t.Fatalf("ClusterIP %q is not in %s", svc.Spec.ClusterIP, ServiceClusterIPRange)
	}
	if _, err := c.DiscoveryV1().EndpointSlices(smokeNS).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: smokeSvc + "-1",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: smokeSvc,
				discoveryv1.LabelManagedBy:   smokeManager,
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"198.19.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"198.19.1.3"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readBack(t, c, svc.Spec.ClusterIP)

	// The admin kubeconfig works for kubectl too.
	out, err := exec.CommandContext(ctx, cp.Binaries.Kubectl, "--kubeconfig", cp.Kubeconfig,
		"get", "endpointslices", "-n", smokeNS, "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "endpointslice.discovery.k8s.io/"+smokeSvc+"-1" {
		t.Fatalf("kubectl get endpointslices: %v: %s", err, out)
	}

	checkServiceAccountToken(t, cp)

	// kube-apiserver down and up again, same port and etcd; the same
	// clientset reconnects.
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = c.CoreV1().Services(smokeNS).Get(short, smokeSvc, metav1.GetOptions{})
	cancel()
	if err == nil {
		t.Fatal("reading a Service worked with kube-apiserver stopped")
	}
	t1 := time.Now()
	if err := cp.RestartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart time: %v", time.Since(t1).Round(time.Millisecond))
	readBack(t, c, svc.Spec.ClusterIP)

	t2 := time.Now()
	if err := cp.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop time: %v", time.Since(t2).Round(time.Millisecond))
}

func readBack(t *testing.T, c kubernetes.Interface, clusterIP string) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.CoreV1().Namespaces().Get(ctx, smokeNS, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := c.CoreV1().Services(smokeNS).Get(ctx, smokeSvc, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP != clusterIP {
		t.Fatalf("ClusterIP read back %q, want %q", svc.Spec.ClusterIP, clusterIP)
	}
	slices, err := c.DiscoveryV1().EndpointSlices(smokeNS).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + smokeSvc + "," + discoveryv1.LabelManagedBy + "=" + smokeManager,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 1 || len(slices.Items[0].Endpoints) != 2 {
		t.Fatalf("EndpointSlices read back: %+v", slices.Items)
	}
}

// checkServiceAccountToken proves the service-account key and issuer work
// and that RBAC is enforced: a ServiceAccount token authenticates, is
// refused until a ClusterRole is bound, and then allowed.
func checkServiceAccountToken(t *testing.T, cp *ControlPlane) {
	t.Helper()
	ctx := t.Context()
	admin := cp.Client()
	if _, err := admin.CoreV1().ServiceAccounts(smokeNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(smokeNS).CreateToken(ctx, "agent", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path, err := cp.TokenKubeconfig(tr.Status.Token)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	list := func() error {
		_, err := sa.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
		return err
	}
	if err := list(); !apierrors.IsForbidden(err) {
		t.Fatalf("ServiceAccount listing EndpointSlices without a role: got %v, want Forbidden", err)
	}

	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke-endpointslice-reader"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"},
			Verbs: []string{"get", "list", "watch"},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke-endpointslice-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "smoke-endpointslice-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: smokeNS, Name: "agent"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The RBAC authorizer reads roles through an informer: allow it a moment.
	deadline := time.Now().Add(10 * time.Second)
	for err = list(); err != nil && time.Now().Before(deadline); err = list() {
		if !apierrors.IsForbidden(err) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("ServiceAccount listing EndpointSlices with a ClusterRole bound: %v", err)
	}
}
