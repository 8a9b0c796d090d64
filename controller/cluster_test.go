package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// Unit tests of the change tracker and the label selection. The cluster
// source against a real API server is covered by the k8s suite.

func TestChangeTrackerDropsNoOps(t *testing.T) {
	tr := NewChangeTracker()
	a := makeService("demo", "web", nil)
	if !tr.ServiceChanged(nil, a) {
		t.Fatal("an added Service is a change")
	}
	tr.Drain()

	// Only the resourceVersion and status changed: no sync needed.
	b := a.DeepCopy()
	b.ResourceVersion = "42"
	b.Status.Conditions = []metav1.Condition{{Type: "Ready"}}
	if tr.ServiceChanged(a, b) {
		t.Error("a resourceVersion/status-only update counted as a change")
	}
	// An annotation change is one; changing it back cancels it.
	c := b.DeepCopy()
	c.Annotations = map[string]string{AnnotationWeights: "web-1=1"}
	if !tr.ServiceChanged(b, c) {
		t.Error("an annotation change was dropped")
	}
	if tr.ServiceChanged(c, b) {
		t.Error("undoing a change counted as a change")
	}
	if svcs, _ := tr.Pending(); svcs != 0 {
		t.Errorf("a change and its undo left %d pending", svcs)
	}
	// Added then deleted before a sync: nothing to do.
	d := makeService("demo", "tmp", nil)
	tr.ServiceChanged(nil, d)
	if tr.ServiceChanged(d, nil) {
		t.Error("deleting a Service added since the last sync counted as a change")
	}
	if svcs, _ := tr.Pending(); svcs != 0 {
		t.Error("add+delete left a pending change")
	}
	// Slices count for their Service.
	sl := makeSlice("demo", "web", "web-a", []discoveryv1.Endpoint{endpoint("198.19.1.2", "web-1", condReady)}, nil)
	// The EndpointSlice controller stamps the time of the change it
	// reacted to; the sync that programs it reports the latency.
	stamp := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	sl.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: stamp.Format(time.RFC3339Nano)}
	tr.SliceChanged(nil, sl)
	drained := tr.Drain()
	if len(drained.Triggers) != 1 || !drained.Triggers[0].Equal(stamp) {
		t.Errorf("trigger times %v, want [%v]", drained.Triggers, stamp)
	}
	got := drained.Services
	if len(got) != 1 || !got[types.NamespacedName{Namespace: "demo", Name: "web"}] {
		t.Errorf("slice change attributed to %v, want demo/web", got)
	}
}

func TestClusterSourceSelection(t *testing.T) {
	labelled := func(v string) func(*corev1.Service) {
		return func(s *corev1.Service) { s.Labels = map[string]string{LabelServiceProxyName: v} }
	}
	objs := []*corev1.Service{
		makeService("demo", "plain", nil),
		makeService("demo", "ours", labelled("steelyard")),
		makeService("demo", "other", labelled("someone-else")),
	}
	for _, tc := range []struct {
		proxyName string
		want      []string
	}{
		{"", []string{"plain"}},
		{"steelyard", []string{"ours"}},
	} {
		client := fake.NewClientset()
		for _, o := range objs {
			if _, err := client.CoreV1().Services(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		src, err := NewClusterSource(client, ClusterOptions{ServiceProxyName: tc.proxyName})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := src.Start(ctx, func() {}); err != nil {
			t.Fatal(err)
		}
		svcs, _, _ := src.Load()
		cancel()
		var got []string
		for _, s := range svcs {
			got = append(got, s.Name)
		}
		if len(got) != len(tc.want) || got[0] != tc.want[0] {
			t.Errorf("--service-proxy-name %q: got %v, want %v", tc.proxyName, got, tc.want)
		}
	}
}
