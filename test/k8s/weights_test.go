//go:build k8s

package k8s

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// TestWeightsThroughAPI: a weighted Service and its EndpointSlice created
// through the API reach the kernel and split real connections by weight; a
// new annotation changes the split; deleting the Service removes its chains.
func TestWeightsThroughAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a, b := backend{"a", "198.19.1.2"}, backend{"b", "198.19.1.3"}
	const vip = "198.18.0.10"
	e.addPods(a, b)
	e.startAgent(e.cp.Kubeconfig)

	e.create(newService("web", vip, map[string]string{weightsKey: "a=10,b=90"}, nil), newSlice("web", nil, a, b))
	took := e.waitShares(vip, map[string]float64{a.ip: 10, b.ip: 90}, 10*time.Second)
	t.Logf("Service and EndpointSlice created -> explain shows 10/90 after %v", took.Round(time.Millisecond))
	e.waitVerify(5 * time.Second)

	// 20,000 connections at 10/90: sigma = sqrt(.1*.9/20000) = 0.21 points,
	// so 1 point is 4.7 sigma.
	r, err := e.client.TCPConns(vipPort(vip), 20000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"a": 10, "b": 90}, 1)

	e.annotate("web", weightsKey, "a=50,b=50")
	took = e.waitShares(vip, map[string]float64{a.ip: 50, b.ip: 50}, 10*time.Second)
	t.Logf("annotation changed to 50/50 -> explain shows it after %v", took.Round(time.Millisecond))
	// 10,000 connections at 50/50: sigma 0.5 points; 2.5 points is 5 sigma.
	r, err = e.client.TCPConns(vipPort(vip), 10000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"a": 50, "b": 50}, 2.5)

	chains := serviceChains(e.ruleset(), testNS+"/web")
	t.Logf("chains of %s/web before the delete: %v", testNS, chains)
	// One Service chain and two endpoint chains at least; in nftables
	// mode the Service chain only: no endpoint chains without affinity,
	// and its weights are a range of a weight map shared with other ports
	// (dataplane/nftables/weightmaps.go), which is not the Service's.
	if want := map[bool]int{true: 1, false: 3}[agentMode == "nftables"]; len(chains) < want {
		t.Fatalf("found only %d chains of %s/web in the ruleset, want %d", len(chains), testNS, want)
	}
	// Only the Service goes: its EndpointSlice stays behind (nothing here
	// garbage-collects it), which must not keep any rule alive.
	if err := e.admin.CoreV1().Services(testNS).Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = sandbox.Poll(t, 10*time.Second, 20*time.Millisecond, "explain dropping "+vip, func() (bool, string) {
		v := viewcheck.Find(e.explain(), vip, servicePort)
		return v == nil, "still listed"
	})
	t.Logf("Service deleted -> explain no longer lists %s after %v", vip, took.Round(time.Millisecond))
	// iptables deletes the chains in the same restore; nftables flushes
	// them at once and deletes them a second later (kernels before 6.2
	// notice late that no map element references them).
	took = sandbox.Poll(t, 10*time.Second, 100*time.Millisecond, "the deleted Service's chains removed", func() (bool, string) {
		save := e.ruleset()
		var left []string
		for _, c := range chains {
			if strings.Contains(save, c) {
				left = append(left, c)
			}
		}
		if len(left) > 0 {
			return false, fmt.Sprintf("chains still in the ruleset: %v", left)
		}
		if strings.Contains(save, testNS+"/web") || strings.Contains(save, vip) {
			return false, "the ruleset still mentions the deleted Service:\n" + save
		}
		return true, ""
	})
	t.Logf("its chains gone from the ruleset after %v", took.Round(time.Millisecond))
	if out, code := e.verify(); code != 0 {
		t.Errorf("verify after the delete: exit %d:\n%s", code, out)
	}
	if text, _, _ := e.steelyard("explain"); strings.Contains(text, vip) {
		t.Errorf("explain still lists %s:\n%s", vip, text)
	}
}

// TestInvalidWeightsEvent: a bad weights annotation produces a Warning
// Event InvalidWeights on its Service and counts as absent, while another
// Service created and changed at the same moment syncs normally.
func TestInvalidWeightsEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g1, g2 := backend{"g1", "198.19.5.2"}, backend{"g2", "198.19.5.3"}
	const goodVIP, badVIP = "198.18.0.50", "198.18.0.51"
	e.addPods(g1, g2)
	e.startAgent(e.cp.Kubeconfig)

	// Both in the same burst, so in the same sync.
	e.create(newService("bad", badVIP, map[string]string{weightsKey: "a=ten"}, nil), newSlice("bad", nil, g1, g2))
	e.create(newService("good", goodVIP, map[string]string{weightsKey: "g1=1,g2=3"}, nil), newSlice("good", nil, g1, g2))
	took := e.waitShares(goodVIP, map[string]float64{g1.ip: 25, g2.ip: 75}, 10*time.Second)
	t.Logf("good (created with bad) in the kernel after %v", took.Round(time.Millisecond))
	// The bad annotation never had a valid value: it counts as absent, so
	// every endpoint weighs 1.
	e.waitShares(badVIP, map[string]float64{g1.ip: 50, g2.ip: 50}, 5*time.Second)
	ev := e.waitEvent("bad", controller.ReasonInvalidWeights, weightsKey, 15*time.Second)
	if ev.Type != corev1.EventTypeWarning || ev.Source.Component != "steelyard" || ev.Source.Host != nodeName {
		t.Errorf("Event: type %q source %+v, want Warning from steelyard on %s", ev.Type, ev.Source, nodeName)
	}
	for _, ev := range e.events("good") {
		t.Errorf("Event on the good Service: %s %s", ev.Reason, ev.Message)
	}
	// 4,000 connections at 25/75: sigma 0.68 points; 3 points is 4.4 sigma.
	r, err := e.client.TCPConns(vipPort(goodVIP), 4000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"g1": 25, "g2": 75}, 3)
	if got := e.metrics()["steelyard_invalid_input"]; got != 1 {
		t.Errorf("steelyard_invalid_input = %v, want 1", got)
	}

	// Change both at once: bad stays bad (another reason), good flips.
	e.annotate("bad", weightsKey, "g1=1,g1=2")
	e.annotate("good", weightsKey, "g1=3,g2=1")
	took = e.waitShares(goodVIP, map[string]float64{g1.ip: 75, g2.ip: 25}, 10*time.Second)
	t.Logf("good changed together with bad -> in the kernel after %v", took.Round(time.Millisecond))
	e.waitEvent("bad", controller.ReasonInvalidWeights, "duplicate", 15*time.Second)
	if got := viewcheck.Shares(viewcheck.Find(e.explain(), badVIP, servicePort)); !viewcheck.Same(got, map[string]float64{g1.ip: 50, g2.ip: 50}) {
		t.Errorf("bad after a second bad value: %v, want 50/50 (still absent)", got)
	}
	r, err = e.client.TCPConns(vipPort(goodVIP), 4000, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	sandbox.ExpectShares(t, r, map[string]float64{"g1": 75, "g2": 25}, 3)

	// Fixed: bad takes its weights, the gauge drops to 0.
	e.annotate("bad", weightsKey, "g1=1,g2=3")
	e.waitShares(badVIP, map[string]float64{g1.ip: 25, g2.ip: 75}, 10*time.Second)
	sandbox.Poll(t, 5*time.Second, 50*time.Millisecond, "steelyard_invalid_input back to 0", func() (bool, string) {
		v := e.metrics()["steelyard_invalid_input"]
		return v == 0, fmt.Sprintf("it is %v", v)
	})
	e.waitVerify(5 * time.Second)
}
