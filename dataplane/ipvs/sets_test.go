package ipvs

import (
	"net/netip"
	"slices"
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
