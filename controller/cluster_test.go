package controller

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
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

// refused is what a client sees while kube-apiserver is down.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// outageClient is a fake clientset whose API server can be stopped: while
// down, every list and watch is refused, and stopping it ends the open
// watches as a dying server does.
type outageClient struct {
	*fake.Clientset
	down    atomic.Bool
	mu      sync.Mutex
	watches []watch.Interface
}

func newOutageClient(objs ...runtime.Object) *outageClient {
	c := &outageClient{Clientset: fake.NewClientset(objs...)}
	c.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if c.down.Load() {
			return true, nil, refused
		}
		return false, nil, nil
	})
	c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if c.down.Load() {
			return true, nil, refused
		}
		w, err := c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		c.mu.Lock()
		c.watches = append(c.watches, w)
		c.mu.Unlock()
		return true, w, nil
	})
	return c
}

func (c *outageClient) stop() {
	c.down.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.watches {
		w.Stop()
	}
	c.watches = nil
}

// TestClusterSourceOutage: the API server goes away and comes back. The
// source logs the outage once when it starts and once when it ends, and a
// change made while it was down (a Service deleted, one added) reaches
// the tracker and the listers after the relist.
func TestClusterSourceOutage(t *testing.T) {
	client := newOutageClient(makeService("demo", "web", nil), makeService("demo", "old", nil))
	src, err := NewClusterSource(client, ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logger, hook := logtest.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	src.API.log = logger.WithField("subsys", "controller")
	var changes atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := src.Start(ctx, func() { changes.Add(1) }); err != nil {
		t.Fatal(err)
	}
	src.Tracker.Drain()

	client.stop()
	waitFor(t, 5*time.Second, "the outage to be noticed", func() bool { return !src.API.Reachable() })
	// Changes the agent cannot see while the API server is down: they
	// come with the relist. The fake's tracker is written directly.
	if err := client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("services"), "demo", "old"); err != nil {
		t.Fatal(err)
	}
	if err := client.Tracker().Add(makeService("demo", "api", nil)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // several refused retries
	before := changes.Load()
	client.down.Store(false)
	waitFor(t, 10*time.Second, "the watch to come back", func() bool { return src.API.Reachable() })
	waitFor(t, 5*time.Second, "the relist to reach the listers", func() bool {
		svcs, _, _ := src.Load()
		names := map[string]bool{}
		for _, s := range svcs {
			names[s.Name] = true
		}
		return len(svcs) == 2 && names["web"] && names["api"]
	})
	if changes.Load() == before {
		t.Error("the relist after the outage did not call onChange")
	}
	got := src.Tracker.Drain().Services
	for _, name := range []string{"old", "api"} {
		if !got[types.NamespacedName{Namespace: "demo", Name: name}] {
			t.Errorf("tracker after the outage: %v, want demo/old and demo/api", got)
		}
	}
	if got[types.NamespacedName{Namespace: "demo", Name: "web"}] {
		t.Errorf("the unchanged demo/web counted as a change after the relist")
	}

	var warns, infos, debugs int
	for _, e := range hook.AllEntries() {
		switch {
		case e.Message == "API server still unreachable":
			debugs++
		case e.Level == logrus.WarnLevel:
			warns++
			if e.Data[logrus.ErrorKey] == nil || e.Data[fieldResource] == nil {
				t.Errorf("outage warning without the error or resource: %v", e.Data)
			}
		case e.Message == "API server reachable again":
			infos++
			if d, err := time.ParseDuration(e.Data[fieldDownFor].(string)); err != nil || d < 3*time.Second {
				t.Errorf("down_for %v (%v), want >= 3s", e.Data[fieldDownFor], err)
			}
		}
	}
	if warns != 1 || infos != 1 {
		t.Errorf("%d warnings and %d recovery lines for one outage, want 1 and 1", warns, infos)
	}
	if n, d := src.API.Outages(); n != 1 || d < 3*time.Second {
		t.Errorf("Outages() = %d, %v; want 1, >= 3s", n, d)
	}
	t.Logf("%d refused retries in about 3 s logged at debug level", debugs)
}

// TestAPIHealthNeedsEveryResource: the outage ends only when every
// resource's latest request succeeded; an expired resourceVersion and a
// request ended by the agent stopping are not failures.
func TestAPIHealthNeedsEveryResource(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	h := NewAPIHealth(clk)
	logger, hook := logtest.NewNullLogger()
	h.log = logger.WithField("subsys", "controller")
	ctx := context.Background()

	h.observe(ctx, "services", refused)
	clk.Step(time.Second)
	h.observe(ctx, "endpointslices", refused)
	h.observe(ctx, "services", refused)
	clk.Step(4 * time.Second)
	h.observe(ctx, "services", nil)
	if h.Reachable() {
		t.Error("reachable while EndpointSlices still fail")
	}
	clk.Step(time.Second)
	h.observe(ctx, "endpointslices", nil)
	if !h.Reachable() {
		t.Error("not reachable after every resource succeeded")
	}
	if n, d := h.Outages(); n != 1 || d != 6*time.Second {
		t.Errorf("Outages() = %d, %v; want 1, 6s", n, d)
	}
	if len(hook.AllEntries()) != 2 || hook.AllEntries()[1].Data[fieldDownFor] != "6s" {
		t.Errorf("log lines %v, want one warning and one info with down_for=6s", hook.AllEntries())
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	h.observe(cancelled, "services", context.Canceled)
	if !h.Reachable() {
		t.Error("a request ended by the agent stopping counted as an outage")
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWatchStoreStripsUnread checks that stored objects lose managedFields
// and kubectl's last-applied copy, on every way in (watch events, the
// streaming list's transform and a relist), and keep what the agent reads.
func TestWatchStoreStripsUnread(t *testing.T) {
	mk := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: name, ResourceVersion: "1",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
			Annotations: map[string]string{
				corev1.LastAppliedConfigAnnotation: `{"a":"whole copy"}`,
				"steelyard.io/weights":             "a=1",
			},
		}}
	}
	s := newWatchStore()
	if err := s.Add(mk("added")); err != nil {
		t.Fatal(err)
	}
	if err := s.Replace([]any{mk("added"), mk("relisted")}, "2"); err != nil {
		t.Fatal(err)
	}
	streamed, _ := s.Transformer()(mk("streamed"))
	if err := s.Add(streamed); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"added", "relisted", "streamed"} {
		o, ok, err := s.GetByKey("ns/" + name)
		if err != nil || !ok {
			t.Fatalf("%s: not stored (%v)", name, err)
		}
		svc := o.(*corev1.Service)
		if len(svc.ManagedFields) != 0 {
			t.Errorf("%s: managedFields kept: %v", name, svc.ManagedFields)
		}
		if _, ok := svc.Annotations[corev1.LastAppliedConfigAnnotation]; ok {
			t.Errorf("%s: last-applied annotation kept", name)
		}
		if svc.Annotations["steelyard.io/weights"] != "a=1" {
			t.Errorf("%s: the weights annotation was lost: %v", name, svc.Annotations)
		}
	}
}

// TestWatchStoreStripsSlices checks that stored EndpointSlices keep what
// the Builder reads of each endpoint (addresses, conditions, the pod's
// name, node, zone, hints) and lose their owner references and the rest
// of the target reference.
func TestWatchStoreStripsSlices(t *testing.T) {
	ready, node, zone := true, "node-a", "zone-a"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", ResourceVersion: "1",
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Service", Name: "web", UID: "u1"}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"198.19.0.2"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			Hostname:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "web-0", UID: "u2", ResourceVersion: "7"},
			NodeName:   &node,
			Zone:       &zone,
			Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
		}},
	}
	s := newWatchStore()
	if err := s.Add(sl); err != nil {
		t.Fatal(err)
	}
	o, ok, err := s.GetByKey("ns/web-1")
	if err != nil || !ok {
		t.Fatalf("not stored (%v)", err)
	}
	got := o.(*discoveryv1.EndpointSlice)
	if len(got.OwnerReferences) != 0 {
		t.Errorf("owner references kept: %v", got.OwnerReferences)
	}
	ep := got.Endpoints[0]
	want := discoveryv1.Endpoint{
		Addresses:  []string{"198.19.0.2"},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		TargetRef:  &corev1.ObjectReference{Name: "web-0"},
		NodeName:   &node,
		Zone:       &zone,
		Hints:      &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}},
	}
	if !apiequality.Semantic.DeepEqual(ep, want) {
		t.Errorf("stored endpoint %+v, want %+v", ep, want)
	}
	if got.Labels[discoveryv1.LabelServiceName] != "web" {
		t.Errorf("service-name label lost: %v", got.Labels)
	}
}
