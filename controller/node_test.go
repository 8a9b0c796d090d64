package controller

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/steelyard-net/steelyard/dataplane"
)

func testNode(name, zone string, addrs ...corev1.NodeAddress) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if zone != "" {
		n.Labels[corev1.LabelTopologyZone] = zone
	}
	n.Status.Addresses = addrs
	return n
}

func internal(ip string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip}
}

func TestNodeFactsPrimaryAddresses(t *testing.T) {
	n := testNode("a", "z1",
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: "a"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.19.9.9"},
		internal("198.19.0.1"), internal("198.19.0.2"), internal("2001:2::1"))
	got := nodeFacts(n)
	want := NodeFacts{Zone: "z1", Addrs: []netip.Addr{netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("2001:2::1")}}
	if !got.Equal(want) {
		t.Fatalf("facts %+v, want %+v", got, want)
	}
	// No InternalIP: the ExternalIP.
	got = nodeFacts(testNode("a", "", corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "198.19.9.9"}))
	if len(got.Addrs) != 1 || got.Addrs[0] != netip.MustParseAddr("198.19.9.9") {
		t.Fatalf("addresses %v, want the ExternalIP", got.Addrs)
	}
}

// The watcher follows zone and address changes of its own Node, ignores
// other Nodes (even when the server ignores the field selector, as the
// fake does) and changes that do not touch its facts.
func TestWatchNodeFollowsOwnNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(testNode("a", "z1", internal("198.19.0.1")), testNode("b", "z9", internal("198.19.0.9")))
	changes := make(chan NodeFacts, 16)
	w := WatchNode(ctx, client, "a", func(f NodeFacts) { changes <- f })
	next := func(what string) NodeFacts {
		t.Helper()
		select {
		case f := <-changes:
			return f
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no change seen", what)
			return NodeFacts{}
		}
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case f := <-changes:
			t.Fatalf("%s: unexpected change %+v", what, f)
		case <-time.After(300 * time.Millisecond):
		}
	}
	if f := next("first sighting"); f.Zone != "z1" || len(f.Addrs) != 1 || f.Addrs[0] != netip.MustParseAddr("198.19.0.1") {
		t.Fatalf("first facts %+v", f)
	}
	update := func(n *corev1.Node) {
		t.Helper()
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update(testNode("b", "z8", internal("198.19.0.8")))
	quiet("another node changed")

	n := testNode("a", "z1", internal("198.19.0.1"))
	n.Annotations = map[string]string{"x": "y"}
	update(n)
	quiet("an annotation changed")

	update(testNode("a", "z2", internal("198.19.0.1")))
	if f := next("zone change"); f.Zone != "z2" {
		t.Fatalf("zone %q, want z2", f.Zone)
	}
	update(testNode("a", "z2", internal("198.19.0.3")))
	if f := next("address change"); len(f.Addrs) != 1 || f.Addrs[0] != netip.MustParseAddr("198.19.0.3") {
		t.Fatalf("addresses %v, want 198.19.0.3", f.Addrs)
	}
	if f, ok := w.Facts(); !ok || f.Zone != "z2" || f.Addrs[0] != netip.MustParseAddr("198.19.0.3") {
		t.Fatalf("Facts() = %+v, %v", f, ok)
	}
	// Node IPAM gives the node its range (--detect-local-mode=NodeCIDR
	// follows it).
	n = testNode("a", "z2", internal("198.19.0.3"))
	n.Spec.PodCIDRs = []string{"198.19.65.7/24", "2001:2:0:1:1::/80"}
	update(n)
	if f := next("pod range change"); len(f.PodCIDRs) != 2 || f.PodCIDRs[0] != netip.MustParsePrefix("198.19.65.0/24") || f.PodCIDRs[1] != netip.MustParsePrefix("2001:2:0:1:1::/80") {
		t.Fatalf("pod ranges %v, want 198.19.65.0/24 (masked) and 2001:2:0:1:1::/80", f.PodCIDRs)
	}
}

// recordingDataplane keeps the last State it was given.
type recordingDataplane struct {
	failingDataplane
	last dataplane.State
}

func (d *recordingDataplane) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	d.last = s
	return d.failingDataplane.Sync(s, req)
}

// A zone change reported through Agent.Zone (the NodeWatcher's) reaches the
// next sync's topology: the hinted endpoint of the new zone is in zone, the
// other is not.
func TestAgentZoneFollowsNode(t *testing.T) {
	hinted := func(ip, pod, zone string) discoveryv1.Endpoint {
		ep := ready(ip, pod)
		ep.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
		return ep
	}
	src := &staticSource{
		svcs:   []*corev1.Service{makeService("demo", "web", nil)},
		slices: []*discoveryv1.EndpointSlice{makeSlice("demo", "web", "web-1", []discoveryv1.Endpoint{hinted("198.19.1.1", "a1", "zone-a"), hinted("198.19.1.2", "b1", "zone-b")}, nil)},
	}
	d := &recordingDataplane{}
	zone := "zone-a"
	a := &Agent{Source: src, Builder: NewBuilder(), Dataplane: d, Zone: func() string { return zone }}
	inZone := func() []string {
		t.Helper()
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, sp := range d.last.Services {
			for _, b := range sp.ClusterBackends() {
				names = append(names, b.Name)
			}
		}
		return names
	}
	if got := inZone(); len(got) != 1 || got[0] != "a1" {
		t.Fatalf("zone-a: in-zone backends %v, want [a1]", got)
	}
	zone = "zone-b"
	if got := inZone(); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("zone-b: in-zone backends %v, want [b1]", got)
	}
}
