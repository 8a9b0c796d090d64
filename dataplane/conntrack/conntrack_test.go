package conntrack

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Test IP plan: VIPs 198.18.0.x, pods 198.19.1.x, client 198.19.254.2.
var (
	vip     = netip.MustParseAddr("198.18.0.13")
	vip2    = netip.MustParseAddr("198.18.0.14")
	pod1    = netip.MustParseAddr("198.19.1.2")
	pod2    = netip.MustParseAddr("198.19.1.3")
	client  = netip.MustParseAddr("198.19.254.2")
	vip6    = netip.MustParseAddr("2001:2::10")
	pod6    = netip.MustParseAddr("2001:2::1:2")
	client6 = netip.MustParseAddr("2001:2::fe:2")
)

func ap(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }

// natFlow is a flow from the client to vip:port DNATed to pod:podPort.
func natFlow(proto dataplane.Protocol, cl netip.Addr, sport uint16, v netip.Addr, port uint16, pod netip.Addr, podPort uint16) Flow {
	return Flow{Protocol: proto, OrigSrc: ap(cl, sport), OrigDst: ap(v, port), ReplySrc: ap(pod, podPort), ReplyDst: ap(cl, sport)}
}

func TestFilterMatch(t *testing.T) {
	toPod1 := natFlow(dataplane.UDP, client, 20000, vip, 53, pod1, 5353)
	toPod2 := natFlow(dataplane.UDP, client, 20001, vip, 53, pod2, 5353)
	otherVIP := natFlow(dataplane.UDP, client, 20002, vip2, 53, pod1, 5353)
	tcp := natFlow(dataplane.TCP, client, 20003, vip, 53, pod1, 5353)
	direct := Flow{Protocol: dataplane.UDP, OrigSrc: ap(client, 20004), OrigDst: ap(pod1, 5353), ReplySrc: ap(pod1, 5353), ReplyDst: ap(client, 20004)}
	fromPod := Flow{Protocol: dataplane.UDP, OrigSrc: ap(pod1, 40000), OrigDst: ap(client, 53), ReplySrc: ap(client, 53), ReplyDst: ap(pod1, 40000)}
	unNATed := Flow{Protocol: dataplane.UDP, OrigSrc: ap(client, 20005), OrigDst: ap(vip, 53), ReplySrc: ap(vip, 53), ReplyDst: ap(client, 20005)}
	v6 := natFlow(dataplane.UDP, client6, 20006, vip6, 53, pod6, 5353)
	all := []Flow{toPod1, toPod2, otherVIP, tcp, direct, fromPod, unNATed, v6}

	cases := []struct {
		name   string
		filter Filter
		want   []Flow
	}{
		{"service endpoint", Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53, ReplySrc: pod1}, []Flow{toPod1}},
		{"service endpoint with port", Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53, ReplySrc: pod1, ReplySrcPort: 5353}, []Flow{toPod1}},
		{"wrong endpoint port", Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53, ReplySrc: pod1, ReplySrcPort: 5354}, nil},
		{"whole VIP port", Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53}, []Flow{toPod1, toPod2, unNATed}},
		{"un-NATed entries of a VIP", Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53, ReplySrc: vip}, []Flow{unNATed}},
		{"pod address", Filter{Addr: pod1}, []Flow{toPod1, otherVIP, tcp, direct}},
		{"pod address, UDP", Filter{Protocol: dataplane.UDP, Addr: pod1}, []Flow{toPod1, otherVIP, direct}},
		{"IPv6 endpoint", Filter{Protocol: dataplane.UDP, OrigDst: vip6, OrigDstPort: 53, ReplySrc: pod6}, []Flow{v6}},
		{"empty filter matches nothing", Filter{Protocol: dataplane.UDP}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []Flow
			for _, f := range all {
				if c.filter.Match(f, nil) {
					got = append(got, f)
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("%s matched %v, want %v", c.filter, got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("%s matched %v, want %v", c.filter, got, c.want)
				}
			}
		})
	}
}

func TestFakeDeleteKeepsUnrelatedFlows(t *testing.T) {
	stale := natFlow(dataplane.UDP, client, 20000, vip, 53, pod1, 5353)
	live := natFlow(dataplane.UDP, client, 20001, vip, 53, pod2, 5353)
	direct := Flow{Protocol: dataplane.UDP, OrigSrc: ap(client, 20004), OrigDst: ap(pod1, 5353), ReplySrc: ap(pod1, 5353), ReplyDst: ap(client, 20004)}
	ct := NewFake(stale, live, direct)
	n, err := ct.Delete(Filter{Protocol: dataplane.UDP, OrigDst: vip, OrigDstPort: 53, ReplySrc: pod1})
	if err != nil || n != 1 {
		t.Fatalf("Delete: %d, %v; want 1, nil", n, err)
	}
	got, _ := ct.List()
	if len(got) != 2 || got[0] != live || got[1] != direct {
		t.Errorf("left %v, want the live VIP flow and the direct flow", got)
	}
}

func TestEmptyFilterIsRefused(t *testing.T) {
	ct := NewFake(natFlow(dataplane.UDP, client, 20000, vip, 53, pod1, 5353))
	for _, f := range []Filter{{}, {Protocol: dataplane.UDP}, {OrigDstPort: 53}} {
		if _, err := ct.Delete(Filter{Addr: pod2}, f); err == nil {
			t.Errorf("Delete(%s) succeeded, want an error", f)
		} else if f.OrigDstPort == 0 && !errors.Is(err, ErrEmptyFilter) {
			t.Errorf("Delete(%s): %v, want ErrEmptyFilter", f, err)
		}
	}
	if got, _ := ct.List(); len(got) != 1 {
		t.Errorf("a refused Delete changed the table: %v", got)
	}
}

// Node ports are reached at the node's own addresses: OrigDstLocal with a
// port, matched against the addresses the table knows as local.
func TestNodePortFilters(t *testing.T) {
	node, lan, other := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.19.254.1"), netip.MustParseAddr("198.19.9.9")
	node6 := netip.MustParseAddr("2001:2:0:fe::1")
	toNode := natFlow(dataplane.UDP, client, 20000, node, 30053, pod1, 5353)
	toLAN := natFlow(dataplane.UDP, client, 20001, lan, 30053, pod2, 5353)
	otherPort := natFlow(dataplane.UDP, client, 20002, node, 30054, pod1, 5353)
	raw := Flow{Protocol: dataplane.UDP, OrigSrc: ap(client, 20003), OrigDst: ap(node, 30053), ReplySrc: ap(node, 30053), ReplyDst: ap(client, 20003)}
	outbound := Flow{Protocol: dataplane.UDP, OrigSrc: ap(node, 40000), OrigDst: ap(other, 30053), ReplySrc: ap(other, 30053), ReplyDst: ap(node, 40000)}
	v6 := natFlow(dataplane.UDP, client6, 20004, node6, 30053, pod6, 5353)
	raw6 := Flow{Protocol: dataplane.UDP, OrigSrc: ap(client6, 20005), OrigDst: ap(node6, 30053), ReplySrc: ap(node6, 30053), ReplyDst: ap(client6, 20005)}
	all := []Flow{toNode, toLAN, otherPort, raw, outbound, v6, raw6}
	local := NewLocal(node, lan, node6)

	cases := []struct {
		name   string
		filter Filter
		local  Local
		want   []Flow
	}{
		{"node port to an endpoint", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053, ReplySrc: pod1, ReplySrcPort: 5353}, local, []Flow{toNode}},
		{"whole node port, IPv4", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053, Family: 4}, local, []Flow{toNode, toLAN, raw}},
		{"whole node port, any family", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053}, local, []Flow{toNode, toLAN, raw, v6, raw6}},
		{"untranslated node port entries", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053, Untranslated: true, Family: 4}, local, []Flow{raw}},
		{"untranslated IPv6", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053, Untranslated: true, Family: 6}, local, []Flow{raw6}},
		{"one flow at a local address", Filter{Protocol: dataplane.UDP, OrigDst: lan, OrigDstPort: 30053, OrigDstLocal: true, ReplySrc: pod2, ReplySrcPort: 5353}, local, []Flow{toLAN}},
		{"no local addresses known: nothing", Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053}, nil, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []Flow
			for _, f := range all {
				if c.filter.Match(f, c.local) {
					got = append(got, f)
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("%s matched %v, want %v", c.filter, got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("%s matched %v, want %v", c.filter, got, c.want)
				}
			}
		})
	}

	ct := NewFake(all...)
	ct.SetLocal(node, lan, node6)
	if n, err := ct.Delete(Filter{Protocol: dataplane.UDP, OrigDstLocal: true, OrigDstPort: 30053, ReplySrc: pod1}); err != nil || n != 1 {
		t.Fatalf("Delete: %d, %v; want 1, nil", n, err)
	}
}

func TestFilterValidate(t *testing.T) {
	bad := []Filter{
		{OrigDstLocal: true},                          // every flow to the node
		{Protocol: dataplane.UDP, Untranslated: true}, // every untranslated flow
		{OrigDstPort: 30053},                          // a port of any address
		{ReplySrc: pod1, OrigDstPort: 30053},          // idem, of one endpoint
		{OrigDst: vip, Family: 6},                     // families disagree
		{OrigDst: vip, ReplySrc: pod6},
		{OrigDstLocal: true, OrigDstPort: 30053, Family: 5},
	}
	for _, f := range bad {
		if err := f.Validate(); err == nil {
			t.Errorf("%s: valid, want an error", f)
		}
	}
	good := []Filter{
		{OrigDstLocal: true, OrigDstPort: 30053},
		{OrigDstLocal: true, OrigDstPort: 30053, Family: 6, Untranslated: true},
		{OrigDst: vip, OrigDstPort: 53, Untranslated: true},
		{OrigDst: vip6, Family: 6},
	}
	for _, f := range good {
		if err := f.Validate(); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
