//go:build k8s

package k8s

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// manifestsDir is the repository's manifests/, from this package's directory.
var manifestsDir = filepath.Join("..", "..", "manifests")

// TestRBAC: manifests/ passes a server-side dry run; with its Namespace and
// RBAC objects applied, an agent authenticated as the steelyard
// ServiceAccount syncs a weighted Service and records an InvalidWeights
// Event (the ClusterRole suffices), and the same token can do nothing else
// (the ClusterRole grants nothing more).
func TestRBAC(t *testing.T) {
	t.Parallel()
	// kube-apiserver refuses privileged containers unless told otherwise;
	// clusters that can run a node agent allow them (kubeadm sets this).
	e := newEnv(t, controlplane.WithAPIServerArgs("--allow-privileged=true"))
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), e.cp.Binaries.Kubectl, append([]string{"--kubeconfig", e.cp.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}

	// A server-side dry run does not persist the Namespace it "creates", so
	// on an empty cluster every namespaced object of manifests/ fails with
	// "namespaces steelyard not found": create the Namespace first, then
	// dry-run everything (the DaemonSet included: validation, defaulting
	// and admission run, the priority class must exist).
	out := kubectl("apply", "-f", filepath.Join(manifestsDir, "00-namespace.yaml"))
	t.Logf("kubectl apply -f manifests/00-namespace.yaml: %s", out)
	out = kubectl("apply", "--dry-run=server", "-f", manifestsDir)
	t.Logf("kubectl apply --dry-run=server -f manifests/:\n%s", out)
	if n := strings.Count(out, "(server dry run)"); n != 8 {
		t.Errorf("the dry run reported %d objects, want the 8 of manifests/", n)
	}
	out = kubectl("apply", "-f", filepath.Join(manifestsDir, "10-rbac.yaml"))
	t.Logf("kubectl apply -f manifests/10-rbac.yaml:\n%s", out)

	tr, err := e.admin.CoreV1().ServiceAccounts("steelyard").CreateToken(t.Context(), "steelyard", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := e.cp.TokenKubeconfig(tr.Status.Token)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The RBAC authorizer reads the new binding through an informer: wait
	// until it is in force, so the agent does not start into Forbidden.
	sandbox.Poll(t, 10*time.Second, 100*time.Millisecond, "the ClusterRoleBinding to take effect", func() (bool, string) {
		_, err := sa.CoreV1().Services("").List(context.Background(), metav1.ListOptions{Limit: 1})
		return err == nil, fmt.Sprint(err)
	})

	r1, r2 := backend{"r1", "198.19.7.2"}, backend{"r2", "198.19.7.3"}
	const webVIP, badVIP = "198.18.0.70", "198.18.0.71"
	e.addPods(r1, r2)
	e.startAgent(kubeconfig)
	e.create(newService("rbac-web", webVIP, map[string]string{weightsKey: "r1=20,r2=80"}, nil), newSlice("rbac-web", nil, r1, r2))
	e.create(newService("rbac-bad", badVIP, map[string]string{weightsKey: "r1=ten"}, nil), newSlice("rbac-bad", nil, r1, r2))
	took := e.waitShares(webVIP, map[string]float64{r1.ip: 20, r2.ip: 80}, 10*time.Second)
	t.Logf("agent with the ServiceAccount's token: rbac-web 20/80 in the kernel after %v", took.Round(time.Millisecond))
	e.waitVerify(5 * time.Second)
	// 4,000 at 20/80: sigma 0.63 points; 3 points is 4.7 sigma.
	r, err := e.client.TCPConns(vipPort(webVIP), 4000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"r1": 20, "r2": 80}, 3)
	e.waitEvent("rbac-bad", controller.ReasonInvalidWeights, weightsKey, 15*time.Second)
	if log := e.agent.Log(); strings.Contains(strings.ToLower(log), "forbidden") {
		t.Errorf("the agent was refused something:\n%s", grepLines(log, "forbidden"))
	}

	// Nothing else: a sample of what an agent must never do.
	ctx := t.Context()
	denied := map[string]error{}
	_, denied["list secrets (all namespaces)"] = sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	_, denied["get secret in steelyard"] = sa.CoreV1().Secrets("steelyard").Get(ctx, "x", metav1.GetOptions{})
	_, denied["list pods"] = sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	// Nodes are read-only to it (get/list/watch, for its own Node's watch).
	denied["delete node"] = sa.CoreV1().Nodes().Delete(ctx, "no-such-node", metav1.DeleteOptions{})
	_, denied["create node"] = sa.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "intruder"}}, metav1.CreateOptions{})
	_, denied["list configmaps"] = sa.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	// Of the ConfigMaps only kube-system/kube-proxy (its clusterCIDR,
	// --detect-local-mode): no other name there, not that name elsewhere.
	_, denied["get configmap kube-system/coredns"] = sa.CoreV1().ConfigMaps("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
	_, denied["get configmap kube-proxy in "+testNS] = sa.CoreV1().ConfigMaps(testNS).Get(ctx, "kube-proxy", metav1.GetOptions{})
	if _, err := sa.CoreV1().ConfigMaps("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("as the steelyard ServiceAccount, get configmap kube-system/kube-proxy (there is none): %v, want NotFound", err)
	}
	_, denied["create service"] = sa.CoreV1().Services(testNS).Create(ctx, newService("intruder", "198.18.0.79", nil, nil), metav1.CreateOptions{})
	svc, err := e.admin.CoreV1().Services(testNS).Get(ctx, "rbac-web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, denied["update service"] = sa.CoreV1().Services(testNS).Update(ctx, svc, metav1.UpdateOptions{})
	denied["delete service"] = sa.CoreV1().Services(testNS).Delete(ctx, "rbac-web", metav1.DeleteOptions{})
	_, denied["create endpointslice"] = sa.DiscoveryV1().EndpointSlices(testNS).Create(ctx, newSlice("intruder", nil, r1), metav1.CreateOptions{})
	denied["delete endpointslice"] = sa.DiscoveryV1().EndpointSlices(testNS).Delete(ctx, "rbac-web-1", metav1.DeleteOptions{})
	_, denied["list events"] = sa.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{})
	denied["delete events"] = sa.CoreV1().Events(testNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_, denied["create serviceaccount token"] = sa.CoreV1().ServiceAccounts("steelyard").CreateToken(ctx, "steelyard", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	_, denied["list clusterroles"] = sa.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{})
	names := make([]string, 0, len(denied))
	for n := range denied {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !apierrors.IsForbidden(denied[n]) {
			t.Errorf("as the steelyard ServiceAccount, %s: %v, want Forbidden", n, denied[n])
		}
	}
	t.Logf("Forbidden as the steelyard ServiceAccount, as wanted: %s", strings.Join(names, ", "))

	// And the complete list of what it may do, as the API server computes
	// it: every resource rule must be one the ClusterRole grants or one that
	// a ServiceAccount bound to nothing also has (what the cluster grants
	// every authenticated user: self reviews, cluster trust bundles, ...).
	control := e.saClient("nobody")
	granted := map[string]bool{
		"/services:get": true, "/services:list": true, "/services:watch": true,
		"discovery.k8s.io/endpointslices:get": true, "discovery.k8s.io/endpointslices:list": true, "discovery.k8s.io/endpointslices:watch": true,
		"/events:create": true, "/events:patch": true,
		// Its own Node, followed by a watch filtered by name (zone,
		// primary addresses); RBAC cannot filter by field selector.
		"/nodes:get": true, "/nodes:list": true, "/nodes:watch": true,
	}
	for _, ns := range []string{testNS, "steelyard", "kube-system"} {
		granted := maps.Clone(granted)
		if ns == "kube-system" {
			// The Role steelyard-kube-proxy-config: kube-proxy's
			// clusterCIDR, read once at start.
			granted["/configmaps:get[kube-proxy]"] = true
		}
		baseline := rules(t, control, ns)
		for _, k := range []string{"/services:list", "/secrets:list", "/pods:list"} {
			if baseline[k] {
				t.Fatalf("namespace %s: an unbound ServiceAccount may %s: the check below would prove nothing", ns, k)
			}
		}
		var extra []string
		for k := range rules(t, sa, ns) {
			switch {
			case granted[k]:
			case baseline[k]:
				extra = append(extra, k)
			default:
				t.Errorf("namespace %s: the steelyard ServiceAccount may %s, which manifests/10-rbac.yaml does not grant", ns, k)
			}
		}
		sort.Strings(extra)
		t.Logf("namespace %s: beyond the ClusterRole, the ServiceAccount may only what an unbound one may: %s", ns, strings.Join(extra, " "))
	}
}

// saClient creates ServiceAccount name in testNS and returns a client
// authenticated with a token of it.
func (e *env) saClient(name string) kubernetes.Interface {
	e.t.Helper()
	ctx := e.t.Context()
	if _, err := e.admin.CoreV1().ServiceAccounts(testNS).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	tr, err := e.admin.CoreV1().ServiceAccounts(testNS).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := e.cp.RESTConfig()
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// rules returns the resource rules the client's user has in namespace ns
// (SelfSubjectRulesReview), as "group/resource:verb" (plus "[names]" when
// limited to some names).
func rules(t *testing.T, c kubernetes.Interface, ns string) map[string]bool {
	t.Helper()
	review, err := c.AuthorizationV1().SelfSubjectRulesReviews().Create(t.Context(), &authorizationv1.SelfSubjectRulesReview{
		Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if review.Status.Incomplete {
		t.Fatalf("namespace %s: the rules review is incomplete: %s", ns, review.Status.EvaluationError)
	}
	out := map[string]bool{}
	for _, rule := range review.Status.ResourceRules {
		for _, g := range rule.APIGroups {
			for _, res := range rule.Resources {
				for _, v := range rule.Verbs {
					k := g + "/" + res + ":" + v
					if len(rule.ResourceNames) > 0 {
						k += fmt.Sprint(rule.ResourceNames)
					}
					out[k] = true
				}
			}
		}
	}
	return out
}

// grepLines returns the lines of s containing substr (case-insensitive).
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(l), substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
