package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestSeedPuts checks what -load etcd writes: kube-apiserver's keys, the
// protobuf storage envelope, and objects that decode to Service i with its
// ClusterIP, its IPAddress pointing back at it, and its slice of m
// endpoints.
func TestSeedPuts(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	puts, err := seedPuts(7, 3, created)
	if err != nil {
		t.Fatal(err)
	}
	wantKeys := []string{"/registry/ipaddresses/198.18.4.7", "/registry/services/specs/bench/svc-7", "/registry/endpointslices/bench/svc-7-1"}
	if len(puts) != 3 {
		t.Fatalf("%d puts", len(puts))
	}
	dec := scheme.Codecs.UniversalDeserializer()
	for k, p := range puts {
		if p.key != wantKeys[k] {
			t.Errorf("key %q, want %q", p.key, wantKeys[k])
		}
		if !bytes.HasPrefix(p.value, []byte("k8s\x00")) {
			t.Errorf("%s: not kube-apiserver's protobuf envelope: %q", p.key, p.value[:8])
		}
		obj, gvk, err := dec.Decode(p.value, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", p.key, err)
		}
		switch o := obj.(type) {
		case *networkingv1.IPAddress:
			if gvk.GroupVersion() != networkingv1.SchemeGroupVersion || o.Name != "198.18.4.7" || o.Spec.ParentRef == nil ||
				o.Spec.ParentRef.Resource != "services" || o.Spec.ParentRef.Namespace != benchNS || o.Spec.ParentRef.Name != "svc-7" ||
				o.Labels[networkingv1.LabelManagedBy] != "ipallocator.k8s.io" || o.Labels[networkingv1.LabelIPAddressFamily] != "IPv4" {
				t.Errorf("IPAddress %v %+v", gvk, o)
			}
		case *corev1.Service:
			if gvk.GroupVersion() != corev1.SchemeGroupVersion || o.Name != "svc-7" || o.Namespace != benchNS || o.Spec.ClusterIP != "198.18.4.7" ||
				len(o.Spec.ClusterIPs) != 1 || len(o.Spec.IPFamilies) != 1 || o.Spec.Ports[0].Port != 80 || o.Spec.Ports[0].TargetPort.IntVal != endpointPort ||
				o.UID == "" || !o.CreationTimestamp.Equal(&created) {
				t.Errorf("Service %v %+v", gvk, o)
			}
		case *discoveryv1.EndpointSlice:
			if gvk.GroupVersion() != discoveryv1.SchemeGroupVersion || o.Name != "svc-7-1" || o.Namespace != benchNS ||
				o.Labels[discoveryv1.LabelServiceName] != "svc-7" || len(o.Endpoints) != 3 || o.Endpoints[2].Addresses[0] != epAddr(7, 2, 3) {
				t.Errorf("EndpointSlice %v %+v", gvk, o)
			}
		default:
			t.Errorf("%s: decoded %T", p.key, obj)
		}
	}
	if a, b := clusterIP(0).String(), clusterIP(maxSeedServices-1).String(); a != "198.18.4.0" || b != "198.18.255.253" {
		t.Errorf("ClusterIPs %s .. %s", a, b)
	}
	if uid(1, 7) == uid(3, 7) {
		t.Error("the same UID for two kinds")
	}
}

func TestTxnBody(t *testing.T) {
	b, err := txnBody([]kv{{"/registry/a", []byte("k8s\x00x")}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Success []struct {
			RequestPut struct{ Key, Value string } `json:"requestPut"`
		} `json:"success"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Success) != 1 {
		t.Fatalf("%s", b)
	}
	k, _ := base64.StdEncoding.DecodeString(got.Success[0].RequestPut.Key)
	v, _ := base64.StdEncoding.DecodeString(got.Success[0].RequestPut.Value)
	if string(k) != "/registry/a" || string(v) != "k8s\x00x" {
		t.Errorf("%s", b)
	}
	if 3*seedTxnServices > 128 {
		t.Errorf("%d puts per transaction: over etcd's default --max-txn-ops 128", 3*seedTxnServices)
	}
}
