package controller

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// manifestSeeds are whole files: the examples plus the shapes the decoder
// handles (multi-document, JSON, Lists, foreign kinds, empty documents).
func manifestSeeds(f *testing.F) {
	f.Helper()
	paths, _ := filepath.Glob("../examples/*.yaml")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"---\n# only a comment\n---\n",
		`{"apiVersion":"v1","kind":"Service","metadata":{"name":"a"},"spec":{"clusterIP":"198.18.0.1","ports":[{"port":80}]}}`,
		"apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n  spec: {clusterIP: 198.18.0.1, ports: [{port: 80}]}\n- apiVersion: v1\n  kind: List\n  items: []\n",
		"apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: a}\n  spec: {clusterIP: 198.18.0.1}\n",
		"apiVersion: discovery.k8s.io/v1\nkind: EndpointSliceList\nitems:\n- metadata: {name: a, labels: {kubernetes.io/service-name: a}}\n  addressType: IPv4\n  endpoints: [{addresses: [198.19.0.1]}]\n",
		"apiVersion: example.com/v1\nkind: Widget\nspec: {}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: a\n",
		"kind: Service\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {clusterIP: \"198.18.0.1\", clusterIPs: [\"198.18.0.1\", \"2001:2::1\", \"x\"], ports: [{port: 70000}, {port: 80, protocol: SCTP}]}\n",
	} {
		f.Add([]byte(s))
	}
}

// FuzzManifests feeds whole manifest files to the decoder and what it
// returns to the Builder: never a panic; an error names the file; every
// object returned has a namespace; every VIP built is one of its Service's
// clusterIPs.
func FuzzManifests(f *testing.F) {
	manifestSeeds(f)
	const path = "/manifests/fuzz.yaml"
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := parseManifest(path, data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), path+": ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			if len(objs.services)+len(objs.slices) != 0 {
				t.Fatalf("error %v with %d objects: a file is all or nothing", err, len(objs.services)+len(objs.slices))
			}
			return
		}
		for _, s := range objs.services {
			if s == nil || s.Namespace == "" {
				t.Fatalf("Service without namespace: %+v", s)
			}
		}
		for _, s := range objs.slices {
			if s == nil || s.Namespace == "" {
				t.Fatalf("EndpointSlice without namespace: %+v", s)
			}
		}
		b := NewBuilder()
		b.EnableIPv6()
		state, _ := b.Build(objs.services, objs.slices)
		checkVIPsInClusterIPs(t, state, objs.services)
	})
}
