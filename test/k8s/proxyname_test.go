//go:build k8s

package k8s

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// TestServiceProxyName: with --service-proxy-name steelyard the agent
// programs only the Services labelled service.kubernetes.io/service-proxy-name:
// steelyard; without the flag, only those without the label (the set
// kube-proxy would handle). The EndpointSlices carry the Service's label,
// as the EndpointSlice controller copies it. The second agent replaces the
// first in the same node, so its first (full) sync must also remove the
// chains of the Services it no longer handles.
func TestServiceProxyName(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p1 := backend{"p1", "198.19.6.2"}
	e.addPods(p1)
	services := []struct {
		name, vip, label string
	}{
		{"labelled", "198.18.0.60", "steelyard"},
		{"unlabelled", "198.18.0.61", ""},
		{"other", "198.18.0.62", "kube-proxy-other"},
	}
	for _, s := range services {
		var labels map[string]string
		if s.label != "" {
			labels = map[string]string{controller.LabelServiceProxyName: s.label}
		}
		e.create(newService(s.name, s.vip, nil, labels), newSlice(s.name, labels, p1))
	}

	check := func(flag string, want map[string]bool) {
		t.Helper()
		var extra []string
		if flag != "" {
			extra = []string{"--service-proxy-name", flag}
		}
		e.startAgent(e.cp.Kubeconfig, extra...)
		took := e.waitVerify(10*time.Second, extra...)
		var vips []string
		views := e.explain()
		for _, s := range services {
			v := viewcheck.Find(views, s.vip, servicePort)
			if got := v != nil; got != want[s.name] {
				t.Errorf("--service-proxy-name=%q: Service %s (label %q) programmed: %v, want %v", flag, s.name, s.label, got, want[s.name])
			}
			if v != nil {
				vips = append(vips, s.vip+" "+s.name)
			}
		}
		sort.Strings(vips)
		t.Logf("--service-proxy-name=%q: verify passes %v after start; programmed: %v", flag, took.Round(time.Millisecond), vips)
		for _, s := range services {
			if !want[s.name] {
				continue
			}
			r, err := e.client.TCPConns(vipPort(s.vip), 200, sandbox.Load{})
			if err != nil {
				t.Fatal(err)
			}
			sandbox.ExpectShares(t, r, map[string]float64{"p1": 100}, 0)
		}
		// The API server's own Service (198.18.0.1:443, no endpoints here)
		// is unlabelled too.
		kubernetes := false
		for _, v := range views {
			kubernetes = kubernetes || v.Service == "default/kubernetes:https"
		}
		if kubernetes != (flag == "") {
			t.Errorf("--service-proxy-name=%q: default/kubernetes programmed: %v", flag, kubernetes)
		}
		if flag == "" {
			// The agent without the flag removes what the other one
			// programmed. In nftables mode its chains are flushed at once
			// and deleted a second later (kernels before 6.2), so wait
			// for that while the agent runs.
			var left []string
			sandbox.Poll(t, 10*time.Second, 100*time.Millisecond, "chains of labelled and other removed", func() (bool, string) {
				save := e.ruleset()
				left = append(serviceChains(save, testNS+"/labelled"), serviceChains(save, testNS+"/other")...)
				return len(left) == 0, fmt.Sprintf("chains remain: %v", left)
			})
		}
		if err := e.agent.Stop(); err != nil {
			t.Errorf("agent exit on SIGTERM: %v", err)
		}
	}
	check("steelyard", map[string]bool{"labelled": true})
	check("", map[string]bool{"unlabelled": true})
}
