//go:build gateway

package gateway

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

var manifestsDir = filepath.Join("..", "..", "manifests")

// TestRBACNftables: with only manifests/10-rbac.yaml and
// manifests/gateway/ applied, an agent authenticated as the steelyard
// ServiceAccount, in nftables mode, programs a weighted TCPRoute (20,000
// connections) and, as the Lease holder, writes its status.
func TestRBACNftables(t *testing.T) {
	e := newEnv(t)
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(t.Context(), e.cp.Binaries.Kubectl, append([]string{"--kubeconfig", e.cp.Kubeconfig}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, f := range []string{"00-namespace.yaml", "10-rbac.yaml", "gateway"} {
		t.Logf("kubectl apply -f manifests/%s:\n%s", f, kubectl("apply", "-f", filepath.Join(manifestsDir, f)))
	}
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

	a, b := backend{"a", "198.19.4.2"}, backend{"b", "198.19.4.3"}
	e.addPods(a, b)
	e.service(testNS, "s1", "198.18.0.40", nil, a)
	e.service(testNS, "s2", "198.18.0.41", nil, b)
	e.startAgentWith(kubeconfig, "--mode", "nftables")

	e.newGateway("gw", listener("tcp", gwv1.TCPProtocolType, 80))
	e.tcpRoute(testNS, "web", []gwv1.ParentReference{gatewayParent("gw", "")}, ref("", "s1", 1), ref("", "s2", 4))
	addr := e.gatewayAddress("gw")
	waitCondition(t, "TCPRoute web", "Accepted", metav1.ConditionTrue, "Accepted", e.tcpRouteConds(testNS, "web", "gw"))
	e.waitShares(addr.String(), dataplane.TCP, map[string]float64{a.ip: 20, b.ip: 80}, 15*time.Second)
	r, err := e.client.TCPConns(netip.AddrPortFrom(addr, 80), 20000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	// sigma(20%) at 20,000: 0.28 points; 4.5 sigma is 1.27 (1 was 3.5).
	sandbox.ExpectShares(t, r, map[string]float64{"a": 20, "b": 80}, sandbox.ShareTolerance(20, 20000, 4.5))
	e.waitVerify()
	if log := e.agent.Log(); strings.Contains(log, "forbidden") {
		t.Errorf("the agent was refused something:\n%s", grepLines(log, "forbidden"))
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
