package main

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func kubeProxyCM(conf string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy"},
		Data: map[string]string{"config.conf": conf}}
}

func podCIDRNode(name string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Spec.PodCIDRs = cidrs
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	return n
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, v := range s {
		out = append(out, netip.MustParsePrefix(v))
	}
	return out
}

// The table is the documented resolution order of --detect-local-mode:
// the flag's CIDRs win, then kube-proxy's ConfigMap, then (auto or
// NodeCIDR) this Node's spec.podCIDRs.
func TestDetectLocal(t *testing.T) {
	kubeadm := kubeProxyCM("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 198.19.64.0/18,2001:2:0:1::/64\nmode: iptables\n")
	node := podCIDRNode("n1", "198.19.65.0/24", "2001:2:0:1:1::/80")
	cases := []struct {
		name    string
		mode    string
		flag    []string
		objs    []runtime.Object
		noAPI   bool
		want    localTraffic
		wantErr string
	}{
		{name: "flag wins over everything", mode: DetectClusterCIDR, flag: []string{"198.19.0.0/17"}, objs: []runtime.Object{kubeadm, node},
			want: localTraffic{Mode: DetectClusterCIDR, CIDRs: prefixes("198.19.0.0/17")}},
		{name: "auto with the flag", mode: detectAuto, flag: []string{"198.19.0.0/17", ""}, objs: []runtime.Object{kubeadm, node},
			want: localTraffic{Mode: DetectClusterCIDR, CIDRs: prefixes("198.19.0.0/17")}},
		{name: "ClusterCIDR from kube-proxy's ConfigMap", mode: DetectClusterCIDR, objs: []runtime.Object{kubeadm, node},
			want: localTraffic{Mode: DetectClusterCIDR, CIDRs: prefixes("198.19.64.0/18", "2001:2:0:1::/64")}},
		{name: "auto from kube-proxy's ConfigMap", mode: detectAuto, objs: []runtime.Object{kubeadm, node},
			want: localTraffic{Mode: DetectClusterCIDR, CIDRs: prefixes("198.19.64.0/18", "2001:2:0:1::/64")}},
		{name: "ClusterCIDR and nothing known: none", mode: DetectClusterCIDR, objs: []runtime.Object{node},
			want: localTraffic{Mode: DetectClusterCIDR}},
		{name: "auto without ConfigMap: the node's ranges", mode: detectAuto, objs: []runtime.Object{node},
			want: localTraffic{Mode: DetectNodeCIDR, CIDRs: prefixes("198.19.65.0/24", "2001:2:0:1:1::/80")}},
		{name: "auto, ConfigMap without clusterCIDR: the node's ranges", mode: detectAuto, objs: []runtime.Object{kubeProxyCM("mode: ipvs\n"), node},
			want: localTraffic{Mode: DetectNodeCIDR, CIDRs: prefixes("198.19.65.0/24", "2001:2:0:1:1::/80")}},
		{name: "NodeCIDR ignores the flag and the ConfigMap", mode: DetectNodeCIDR, flag: []string{"198.19.0.0/17"}, objs: []runtime.Object{kubeadm, node},
			want: localTraffic{Mode: DetectNodeCIDR, CIDRs: prefixes("198.19.65.0/24", "2001:2:0:1:1::/80")}},
		{name: "NodeCIDR, only spec.podCIDR (an old server)", mode: DetectNodeCIDR, objs: []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Spec: corev1.NodeSpec{PodCIDR: "198.19.66.0/24"}}},
			want: localTraffic{Mode: DetectNodeCIDR, CIDRs: prefixes("198.19.66.0/24")}},
		{name: "NodeCIDR, no ranges yet: times out", mode: DetectNodeCIDR, objs: []runtime.Object{podCIDRNode("n1")},
			wantErr: "has no spec.podCIDRs after"},
		{name: "NodeCIDR, no Node: times out", mode: DetectNodeCIDR, wantErr: "has no spec.podCIDRs after"},
		{name: "a bad clusterCIDR in the ConfigMap is an error", mode: detectAuto, objs: []runtime.Object{kubeProxyCM("clusterCIDR: 198.19.64.0/33\n"), node},
			wantErr: "clusterCIDR"},
		{name: "a ConfigMap that is not YAML is an error", mode: detectAuto, objs: []runtime.Object{kubeProxyCM("clusterCIDR: [\n"), node},
			wantErr: "config.conf"},
		{name: "a bad flag is an error", mode: DetectClusterCIDR, flag: []string{"198.19.0.0"}, wantErr: "--cluster-cidr"},
		{name: "manifests: only the flag", mode: detectAuto, noAPI: true,
			want: localTraffic{Mode: DetectClusterCIDR}},
		{name: "manifests: NodeCIDR impossible", mode: DetectNodeCIDR, noAPI: true, wantErr: "needs the API server"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var client *fake.Clientset
			if !tc.noAPI {
				client = fake.NewClientset(tc.objs...)
			}
			var got localTraffic
			var err error
			if client == nil {
				got, err = detectLocal(t.Context(), nil, tc.mode, tc.flag, "n1", 50*time.Millisecond)
			} else {
				got, err = detectLocal(t.Context(), client, tc.mode, tc.flag, "n1", 50*time.Millisecond)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one with %q (result %+v)", err, tc.wantErr, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Mode != tc.want.Mode || !slices.Equal(got.CIDRs, tc.want.CIDRs) {
				t.Fatalf("got %s %v (from %s), want %s %v", got.Mode, got.CIDRs, got.From, tc.want.Mode, tc.want.CIDRs)
			}
		})
	}
}

// NodeCIDR waits for node IPAM: ranges that arrive after the start are
// the ones used.
func TestDetectLocalWaitsForPodCIDRs(t *testing.T) {
	client := fake.NewClientset(podCIDRNode("n1"))
	go func() {
		time.Sleep(1500 * time.Millisecond)
		_, _ = client.CoreV1().Nodes().Update(context.Background(), podCIDRNode("n1", "198.19.67.0/24"), metav1.UpdateOptions{})
	}()
	got, err := detectLocal(t.Context(), client, DetectNodeCIDR, nil, "n1", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.CIDRs, prefixes("198.19.67.0/24")) {
		t.Fatalf("CIDRs %v, want 198.19.67.0/24", got.CIDRs)
	}
}

// A kube-proxy ConfigMap the agent may not read (the Role removed) is no
// cluster CIDR, not a failure.
func TestDetectLocalConfigMapForbidden(t *testing.T) {
	client := fake.NewClientset(podCIDRNode("n1", "198.19.65.0/24"))
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "kube-proxy", errors.New("no"))
	})
	got, err := detectLocal(t.Context(), client, detectAuto, nil, "n1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != DetectNodeCIDR || !slices.Equal(got.CIDRs, prefixes("198.19.65.0/24")) {
		t.Fatalf("got %+v, want NodeCIDR 198.19.65.0/24", got)
	}
	// Another API error is retried (the API server starting), and is one
	// once the wait is over: the agent cannot tell what was meant.
	down := 2
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down > 0 {
			down--
			return true, nil, apierrors.NewServiceUnavailable("down")
		}
		return false, nil, nil
	})
	got, err = detectLocal(t.Context(), client, detectAuto, nil, "n1", 30*time.Second)
	if err != nil || got.Mode != DetectNodeCIDR || down != 0 {
		t.Fatalf("after two failed reads: %+v, %v (%d failures left), want NodeCIDR", got, err, down)
	}
	client.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	if _, err := detectLocal(t.Context(), client, detectAuto, nil, "n1", 1500*time.Millisecond); err == nil || !strings.Contains(err.Error(), "reading ConfigMap") {
		t.Fatalf("an API server down for the whole wait: %v, want the read's error", err)
	}
}

func TestCheckDetectLocalMode(t *testing.T) {
	for _, ok := range []string{"", "ClusterCIDR", "NodeCIDR"} {
		if err := checkDetectLocalMode(ok, ""); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"nodecidr", "BridgeInterface", "InterfaceNamePrefix", "x"} {
		if err := checkDetectLocalMode(bad, ""); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if err := checkDetectLocalMode("NodeCIDR", "/etc/steelyard"); err == nil {
		t.Error("NodeCIDR with --manifests accepted")
	}
}

// Under NodeCIDR a change of the ranges ends the run with
// errPodCIDRsChanged; the same ranges, or none (a Node re-registering),
// do not.
func TestPodCIDRsChangedRestarts(t *testing.T) {
	l := localTraffic{Mode: DetectNodeCIDR, CIDRs: prefixes("198.19.65.0/24")}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	check := l.podCIDRsChanged(cancel)
	check(prefixes("198.19.65.0/24"))
	check(nil)
	if ctx.Err() != nil {
		t.Fatal("restarted on the same ranges or none")
	}
	check(prefixes("198.19.66.0/24"))
	if !errors.Is(context.Cause(ctx), errPodCIDRsChanged) {
		t.Fatalf("cause %v, want errPodCIDRsChanged", context.Cause(ctx))
	}
	if (localTraffic{Mode: DetectClusterCIDR}).podCIDRsChanged(cancel) != nil {
		t.Fatal("ClusterCIDR follows the Node's ranges")
	}
}
