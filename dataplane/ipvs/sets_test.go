package ipvs

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

func TestParseSave(t *testing.T) {
	out := []byte(`create STEELYARD-IPVS-VIPS hash:ip,port family inet hashsize 1024 maxelem 65536 comment bucketsize 12 initval 0x1
add STEELYARD-IPVS-VIPS 198.18.0.10,tcp:80 comment "demo/web:http"
add STEELYARD-IPVS-VIPS 198.18.0.53,udp:53 comment "demo/dns:dns"
add OTHER 1.2.3.4,tcp:1
`)
	got, err := parseSave(SetVIPs, out)
	if err != nil {
		t.Fatal(err)
	}
	want := []SetEntry{{"198.18.0.10,tcp:80", "demo/web:http"}, {"198.18.0.53,udp:53", "demo/dns:dns"}}
	if !slices.Equal(got, want) {
		t.Errorf("parseSave = %v, want %v", got, want)
	}
	for _, e := range got {
		vip, ok := parseVIPMember(e.Member)
		if !ok || vipMember(vip) != e.Member {
			t.Errorf("member %q does not round-trip: %v %v", e.Member, vip, ok)
		}
	}
	if vip, _ := parseVIPMember("198.18.0.53,udp:53"); vip != (dataplane.VIP{IP: netip.MustParseAddr("198.18.0.53"), Port: 53, Protocol: dataplane.UDP}) {
		t.Errorf("parseVIPMember = %v", vip)
	}
	for _, bad := range []string{"", "198.18.0.1", "198.18.0.1,tcp", "x,tcp:80", "198.18.0.1,tcp:port"} {
		if _, ok := parseVIPMember(bad); ok {
			t.Errorf("parseVIPMember(%q) accepted", bad)
		}
	}
}

// One "ipset save" of every set gives each family's sets; IPv6 members
// round-trip like IPv4 ones.
func TestParseSaveSetsIPv6(t *testing.T) {
	out := []byte(`create STEELYARD-IPVS-VIPS hash:ip,port family inet hashsize 1024 maxelem 65536 comment
add STEELYARD-IPVS-VIPS 198.18.0.10,tcp:80 comment "demo/web:http"
create STEELYARD-IPVS6-VIPS hash:ip,port family inet6 hashsize 1024 maxelem 65536 comment
add STEELYARD-IPVS6-VIPS 2001:2::10,tcp:80 comment "demo/web:http"
add STEELYARD-IPVS6-LB-SRC 2001:2::20,tcp:80,2001:2:0:fd::/64 comment "0"
add OTHER 2001:2::99,tcp:1
`)
	got, err := parseSaveSets(map[string]bool{SetName(6, SetVIPs): true, SetName(6, SetSourceRanges): true}, out)
	if err != nil {
		t.Fatal(err)
	}
	if w := []SetEntry{{"2001:2::10,tcp:80", "demo/web:http"}}; !slices.Equal(got[SetName(6, SetVIPs)], w) || len(got) != 2 {
		t.Errorf("parseSaveSets = %v", got)
	}
	vip, ok := parseVIPMember("2001:2::10,tcp:80")
	if !ok || vip != (dataplane.VIP{IP: netip.MustParseAddr("2001:2::10"), Port: 80, Protocol: dataplane.TCP}) || vipMember(vip) != "2001:2::10,tcp:80" {
		t.Errorf("IPv6 member does not round-trip: %v %v", vip, ok)
	}
	if r := sourceRanges(got[SetName(6, SetSourceRanges)]); len(r) != 1 || r[dataplane.VIP{IP: netip.MustParseAddr("2001:2::20"), Port: 80, Protocol: dataplane.TCP}][0] != "2001:2:0:fd::/64" {
		t.Errorf("IPv6 source ranges = %v", r)
	}
}

// A member comment stays within ipset's 255 bytes for any name, keeps the
// entry after "|", and reads back as the same Service port name.
func TestLongNameComment(t *testing.T) {
	name := "gateway-conformance-infra/udp-multi-listener-gateway:by-section-and-port/UDPRoute/gateway-conformance-infra/" + strings.Repeat("udp-echo-by-section-and-port-", 8)
	for _, m := range []entryMeta{{entry: dataplane.EntryClusterIP}, {entry: dataplane.EntryClusterIP, local: true}, {entry: dataplane.EntryLoadBalancer}} {
		c := m.comment(name)
		if len(c) > dataplane.IpsetCommentMax || strings.ContainsAny(c, " \t") {
			t.Errorf("comment of %d bytes (or with spaces): %q", len(c), c)
		}
		got, extra := parseComment(c)
		if !dataplane.SameName(got, name) {
			t.Errorf("comment %q reads back as %q", c, got)
		}
		if m.entry == dataplane.EntryLoadBalancer && extra != dataplane.EntryLoadBalancer || m.local && extra != dataplane.PolicyLocal {
			t.Errorf("comment %q: extra %q", c, extra)
		}
	}
}
