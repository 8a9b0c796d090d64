package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestStripKeepsWhatTheBuildReads: the stores' strip drops labels,
// selector, owner references and all of a target reference but its name,
// sizes the endpoint array to its endpoints, and the Build of the stripped
// objects is the Build of the originals.
func TestStripKeepsWhatTheBuildReads(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "svc-1", UID: "u1", Labels: map[string]string{"app": "svc-1"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "198.18.0.10", Selector: map[string]string{"app": "svc-1"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	sl := benchSlice("svc-1", 1)
	sl.Namespace = "demo"
	// As the decoder leaves it: 10 endpoints in an array of 16.
	sl.Endpoints = append(make([]discoveryv1.Endpoint, 0, 16), sl.Endpoints...)
	want, _ := NewBuilder().Build([]*corev1.Service{svc.DeepCopy()}, []*discoveryv1.EndpointSlice{sl.DeepCopy()})

	stripUnread(svc) //nolint:errcheck
	stripUnread(sl)  //nolint:errcheck
	if svc.Labels != nil || svc.Spec.Selector != nil {
		t.Errorf("Service keeps labels %v, selector %v", svc.Labels, svc.Spec.Selector)
	}
	if sl.OwnerReferences != nil || cap(sl.Endpoints) > 12 || len(sl.Endpoints) != 10 {
		t.Errorf("slice: owner references %v, %d endpoints in an array of %d", sl.OwnerReferences, len(sl.Endpoints), cap(sl.Endpoints))
	}
	if r := sl.Endpoints[3].TargetRef; r == nil || r.Name != "svc-1-7d9f8-00003" || r.UID != "" || r.Kind != "" || r.Namespace != "" {
		t.Errorf("target reference %+v, want the pod's name only", r)
	}
	capBefore := cap(sl.Endpoints)
	stripUnread(sl) //nolint:errcheck
	if cap(sl.Endpoints) != capBefore {
		t.Errorf("a second strip copied the endpoints again (%d -> %d)", capBefore, cap(sl.Endpoints))
	}
	got, _ := NewBuilder().Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{sl})
	if len(got.Services) != 1 || len(want.Services) != 1 || len(want.Services[0].Backends) != 10 || !got.Services[0].Equal(&want.Services[0]) {
		t.Errorf("Build of the stripped objects:\n%+v\nwant\n%+v", got.Services, want.Services)
	}
}
