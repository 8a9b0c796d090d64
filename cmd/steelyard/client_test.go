package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestClientAsksForProtobuf checks on the wire that the agent's core
// clientset asks the API server for protobuf (as kube-proxy does): the
// list and watch of Services and EndpointSlices in JSON cost the agent
// its peak of memory at 10,000 Services.
func TestClientAsksForProtobuf(t *testing.T) {
	var (
		mu     sync.Mutex
		accept []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = append(accept, r.URL.Path+" "+r.Header.Get("Accept"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
users: [{name: u, user: {}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	client, err := newClient(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services("").List(context.Background(), metav1.ListOptions{}); err != nil {
		t.Fatalf("list (the server answers JSON, which the client must still accept): %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(accept) == 0 {
		t.Fatal("no request reached the server")
	}
	for _, a := range accept {
		if _, h, _ := strings.Cut(a, " "); !strings.HasPrefix(h, protobuf) {
			t.Errorf("request %q: Accept does not put protobuf first", a)
		}
	}
}
