package controller

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// Manifests follow the IP plan of build_test.go.

const svcWebYAML = `apiVersion: v1
kind: Service
metadata:
  name: web
  annotations:
    steelyard.io/weights: "web-1=10,web-2=90"
spec:
  clusterIP: 198.18.0.1
  ports:
  - name: http
    port: 80
`

const sliceWebYAML = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-a
  namespace: demo
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
endpoints:
- addresses: ["198.19.1.1"]
  targetRef: {kind: Pod, name: web-1}
`

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// names lists "ns/name" of what Load returned, sorted.
func names(services []*corev1.Service, slices []*discoveryv1.EndpointSlice) (svcs, sls []string) {
	for _, s := range services {
		svcs = append(svcs, s.Namespace+"/"+s.Name)
	}
	for _, s := range slices {
		sls = append(sls, s.Namespace+"/"+s.Name)
	}
	sort.Strings(svcs)
	sort.Strings(sls)
	return svcs, sls
}

func TestManifestSourceLoad(t *testing.T) {
	tests := []struct {
		name       string
		files      map[string]string
		wantSvcs   []string
		wantSlices []string
	}{
		{
			name: "multi-document YAML, empty documents, other kinds ignored",
			files: map[string]string{"all.yaml": "---\n# comment only\n---\n" + svcWebYAML + "---\n" + sliceWebYAML +
				"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n" +
				"---\napiVersion: example.org/v1\nkind: Widget\nmetadata: {name: w}\n---\n"},
			wantSvcs:   []string{"default/web"},
			wantSlices: []string{"demo/web-a"},
		},
		{
			name: "JSON",
			files: map[string]string{"svc.json": `{"apiVersion":"v1","kind":"Service",
				"metadata":{"name":"api","namespace":"demo"},
				"spec":{"clusterIP":"198.18.0.2","ports":[{"port":80}]}}`},
			wantSvcs: []string{"demo/api"},
		},
		{
			name: "v1 List in YAML, typed lists in JSON",
			files: map[string]string{
				"list.yml": "apiVersion: v1\nkind: List\nitems:\n" +
					"- apiVersion: v1\n  kind: Service\n  metadata: {name: a, namespace: demo}\n  spec: {clusterIP: 198.18.0.3}\n" +
					"- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: a-1}\n  addressType: IPv4\n  endpoints: []\n" +
					"- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: ignored}\n",
				"svclist.json": `{"apiVersion":"v1","kind":"ServiceList","items":[{"metadata":{"name":"b"}}]}`,
			},
			wantSvcs:   []string{"default/b", "demo/a"},
			wantSlices: []string{"default/a-1"},
		},
		{
			name: "hidden files, other extensions and subdirectories ignored",
			files: map[string]string{
				"web.YAML":         svcWebYAML,
				".hidden.yaml":     strings.ReplaceAll(svcWebYAML, "name: web", "name: hidden"),
				"notes.txt":        strings.ReplaceAll(svcWebYAML, "name: web", "name: txt"),
				"sub/nested.yaml":  strings.ReplaceAll(svcWebYAML, "name: web", "name: nested"),
				"web.yaml~":        strings.ReplaceAll(svcWebYAML, "name: web", "name: backup"),
				"slice.yaml":       sliceWebYAML,
				"emptydoc.yaml":    "# nothing yet\n",
				"whitespace.yaml":  "\n\n",
				"slices-only.json": `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSliceList","items":[{"metadata":{"name":"x"},"addressType":"IPv4"}]}`,
			},
			wantSvcs:   []string{"default/web"},
			wantSlices: []string{"default/x", "demo/web-a"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tc.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, p, content)
			}
			services, slices, errs := NewManifestSource(dir).Load()
			if len(errs) != 0 {
				t.Fatalf("errors: %v", errs)
			}
			svcs, sls := names(services, slices)
			if strings.Join(svcs, ",") != strings.Join(tc.wantSvcs, ",") || strings.Join(sls, ",") != strings.Join(tc.wantSlices, ",") {
				t.Errorf("got services %v slices %v, want %v %v", svcs, sls, tc.wantSvcs, tc.wantSlices)
			}
		})
	}
}

func TestManifestSourceDecodesForTheBuilder(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "web.yaml"), strings.ReplaceAll(svcWebYAML, "name: web\n", "name: web\n  namespace: demo\n")+"---\n"+sliceWebYAML)
	services, slices, errs := NewManifestSource(dir).Load()
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	st, problems := NewBuilder().Build(services, slices)
	if len(problems) != 0 || len(st.Services) != 1 {
		t.Fatalf("state %v, problems %v", st, problems)
	}
	sp := st.Services[0]
	if sp.Name.String() != "demo/web:http" || sp.VIP.String() != "198.18.0.1:80/TCP" ||
		len(sp.Backends) != 1 || sp.Backends[0].Addr().String() != "198.19.1.1:8080" || sp.Backends[0].Weight != 10 {
		t.Errorf("unexpected %+v", sp)
	}
}

func TestManifestSourceKeepsLastGood(t *testing.T) {
	dir := t.TempDir()
	web := filepath.Join(dir, "web.yaml")
	other := filepath.Join(dir, "other.yaml")
	writeFile(t, web, svcWebYAML+"---\n"+sliceWebYAML)
	writeFile(t, other, strings.ReplaceAll(svcWebYAML, "name: web", "name: other"))
	m := NewManifestSource(dir)
	load := func() ([]string, []string, []error) {
		services, slices, errs := m.Load()
		svcs, sls := names(services, slices)
		return svcs, sls, errs
	}
	want := "default/other,default/web|demo/web-a"
	check := func(step string, wantErrs []string, wantObjs string) {
		t.Helper()
		svcs, sls, errs := load()
		if got := strings.Join(svcs, ",") + "|" + strings.Join(sls, ","); got != wantObjs {
			t.Errorf("%s: objects %s, want %s", step, got, wantObjs)
		}
		if len(errs) != len(wantErrs) {
			t.Fatalf("%s: errors %v, want %d", step, errs, len(wantErrs))
		}
		for i, e := range errs {
			if !strings.Contains(e.Error(), wantErrs[i]) {
				t.Errorf("%s: error %q, want it to contain %q", step, e, wantErrs[i])
			}
		}
	}
	check("initial", nil, want)

	// Document 2 broken: the whole file keeps its last good objects.
	writeFile(t, web, svcWebYAML+"---\n"+strings.ReplaceAll(sliceWebYAML, "addressType: IPv4", "addressType: [IPv4"))
	check("broken", []string{web + ": document 2:"}, want)

	// Missing kind is an error too, not an ignored kind.
	writeFile(t, web, "apiVersion: v1\nmetadata: {name: x}\n")
	check("no kind", []string{web + ": document 1:"}, want)

	// Truncated while being rewritten.
	writeFile(t, web, "")
	check("empty", []string{web + ": file is empty"}, want)

	// Fixed, with one object fewer.
	writeFile(t, web, svcWebYAML)
	check("fixed", nil, "default/other,default/web|")

	// Deleted: its objects go.
	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	check("deleted", nil, "default/other|")

	// A file that never parsed contributes nothing.
	writeFile(t, web, "kind: [")
	check("never good", []string{web + ": document 1:"}, "default/other|")

	// An empty file that never had objects is not an error.
	writeFile(t, web, "")
	check("empty new", nil, "default/other|")

	// The directory vanishing keeps everything we had.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	check("no directory", []string{"reading manifest directory"}, "default/other|")
}

// startWatch runs Watch until the test ends and returns a channel that
// receives one value per call of changed.
func startWatch(t *testing.T, m *ManifestSource) <-chan struct{} {
	t.Helper()
	ready := make(chan struct{})
	m.ready = func() { close(ready) }
	calls := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Watch(ctx, func() { calls <- struct{}{} }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Watch returned early: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Watch not ready")
	}
	return calls
}

func waitCall(t *testing.T, calls <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-calls:
	case <-time.After(time.Second):
		t.Fatalf("changed not called within 1s after %s", what)
	}
}

func TestManifestSourceWatch(t *testing.T) {
	dir := t.TempDir()
	m := NewManifestSource(dir)
	calls := startWatch(t, m)
	web := filepath.Join(dir, "web.yaml")

	writeFile(t, web, svcWebYAML)
	waitCall(t, calls, "create")

	writeFile(t, web, strings.ReplaceAll(svcWebYAML, "198.18.0.1", "198.18.0.9"))
	waitCall(t, calls, "write")

	// An editor's save: write a temporary file, rename it over the original.
	tmp := filepath.Join(dir, ".web.yaml.swp")
	writeFile(t, tmp, svcWebYAML)
	if err := os.Rename(tmp, web); err != nil {
		t.Fatal(err)
	}
	waitCall(t, calls, "rename")
	if services, _, _ := m.Load(); len(services) != 1 || services[0].Spec.ClusterIP != "198.18.0.1" {
		t.Errorf("after rename: %v", services)
	}

	if err := os.Remove(web); err != nil {
		t.Fatal(err)
	}
	waitCall(t, calls, "remove")
	if services, _, _ := m.Load(); len(services) != 0 {
		t.Errorf("after remove: %v", services)
	}
}

// TestManifestSourceWatchDebounces: a burst of events, each half a
// debounce after the one before, makes one call, one debounce after the
// last event; a watch error rearms the timer like an event, a Chmod does
// not. The loop runs on a fake clock and takes its events from channels
// the test feeds one at a time, so the outcome does not depend on how fast
// the machine is (it used to skip itself when a burst of real writes took
// too long).
func TestManifestSourceWatchDebounces(t *testing.T) {
	m := NewManifestSource(t.TempDir())
	m.debounce = 100 * time.Millisecond
	fc := clocktesting.NewFakeClock(time.Unix(1_000_000, 0))
	m.clock = fc
	// Unbuffered: a send returns once the loop has taken the event.
	events := make(chan fsnotify.Event)
	errs := make(chan error)
	calls := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.watchLoop(ctx, events, errs, func() { calls <- struct{}{} }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("watchLoop: %v", err)
		}
	}()
	// barrier sends an event the loop ignores: once the loop has taken
	// it, it has finished with everything sent before (one goroutine).
	barrier := func() { events <- fsnotify.Event{Name: "web.yaml", Op: fsnotify.Chmod} }
	// armed reports whether the debounce timer is set and has not fired.
	armed := func() bool { return fc.Waiters() == 1 }
	noCall := func(when string) {
		t.Helper()
		barrier()
		if n := len(calls); n != 0 {
			t.Fatalf("%s: %d calls, want none", when, n)
		}
	}
	oneCall := func(when string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(5 * time.Second): // only a hang gets here
			t.Fatalf("%s: changed not called", when)
		}
		noCall(when + ", after the call")
	}

	barrier()
	if armed() {
		t.Fatal("a Chmod armed the debounce timer")
	}
	for i := range 20 {
		if i == 10 {
			errs <- errors.New("queue overflow")
		} else {
			events <- fsnotify.Event{Name: "web.yaml", Op: fsnotify.Write}
		}
		barrier()
		fc.Step(m.debounce / 2)
		if !armed() {
			t.Fatalf("event %d: the timer fired half a debounce after it", i)
		}
	}
	noCall("during the burst")
	fc.Step(m.debounce/2 - time.Nanosecond)
	if !armed() {
		t.Fatal("the timer fired before a whole debounce passed without events")
	}
	noCall("a nanosecond before the debounce")
	fc.Step(time.Nanosecond)
	if armed() {
		t.Fatal("the timer did not fire a debounce after the last event")
	}
	oneCall("a debounce after the burst")
	fc.Step(10 * m.debounce)
	noCall("ten debounces later, without events")

	// A single event later: one more call.
	events <- fsnotify.Event{Name: "web.yaml", Op: fsnotify.Create}
	barrier()
	fc.Step(m.debounce)
	oneCall("a debounce after a single event")
}

// TestManifestSourceConfigMapSwap mimics how the kubelet updates a mounted
// ConfigMap: files are links through "..data", which is atomically replaced.
func TestManifestSourceConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mustSymlink := func(target, link string) {
		t.Helper()
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	gen := func(name, ip string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "web.yaml"), strings.ReplaceAll(svcWebYAML, "198.18.0.1", ip))
	}
	gen("..2026_01_01_00_00_00.1", "198.18.0.1")
	mustSymlink("..2026_01_01_00_00_00.1", filepath.Join(dir, "..data"))
	mustSymlink("..data/web.yaml", filepath.Join(dir, "web.yaml"))

	m := NewManifestSource(dir)
	if services, _, errs := m.Load(); len(errs) != 0 || len(services) != 1 || services[0].Spec.ClusterIP != "198.18.0.1" {
		t.Fatalf("initial load: %v %v", services, errs)
	}
	calls := startWatch(t, m)

	gen("..2026_01_01_00_01_00.2", "198.18.0.2")
	mustSymlink("..2026_01_01_00_01_00.2", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_01_01_00_00_00.1")); err != nil {
		t.Fatal(err)
	}
	waitCall(t, calls, "the ..data swap")
	if services, _, errs := m.Load(); len(errs) != 0 || len(services) != 1 || services[0].Spec.ClusterIP != "198.18.0.2" {
		t.Fatalf("after swap: %v %v", services, errs)
	}
}

func TestManifestSourceWatchMissingDir(t *testing.T) {
	m := NewManifestSource(filepath.Join(t.TempDir(), "missing"))
	if err := m.Watch(context.Background(), func() {}); err == nil {
		t.Fatal("Watch of a missing directory succeeded")
	}
}

func TestManifestSourceLogsIgnoredKinds(t *testing.T) {
	hook := logtest.NewGlobal()
	defer hook.Reset()
	level := logrus.GetLevel()
	logrus.SetLevel(logrus.DebugLevel)
	defer logrus.SetLevel(level)

	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "x.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n---\napiVersion: example.org/v1\nkind: Widget\n")
	if _, _, errs := NewManifestSource(dir).Load(); len(errs) != 0 {
		t.Fatal(errs)
	}
	var got []string
	for _, e := range hook.AllEntries() {
		if e.Message == "manifest kind not used, ignored" {
			got = append(got, filepath.Base(e.Data[fieldFile].(string))+" "+e.Data[fieldKind].(string))
		}
	}
	if want := "x.yaml v1/ConfigMap,x.yaml example.org/v1/Widget"; strings.Join(got, ",") != want {
		t.Errorf("ignored kinds logged as %q, want %q", got, want)
	}
}
