package cluster

import (
	"encoding/json"
	"net/netip"
	"slices"
	"testing"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The dual-stack conflist gives host-local one range per family, each with
// its gateway, and a default route of each family; the one-family
// conflist is what it was.
func TestMainConflistDualStack(t *testing.T) {
	v4 := netip.MustParsePrefix("198.19.65.0/24")
	v6 := netip.MustParsePrefix("2001:2:0:101::/64")
	var conf struct {
		Plugins []struct {
			Type    string `json:"type"`
			Hairpin bool   `json:"hairpinMode"`
			IPAM    struct {
				Ranges [][]struct {
					Subnet  string `json:"subnet"`
					Gateway string `json:"gateway"`
				} `json:"ranges"`
				Routes []struct {
					Dst string `json:"dst"`
				} `json:"routes"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(mainConflistRanges(true, []netip.Prefix{v4, v6})), &conf); err != nil {
		t.Fatal(err)
	}
	if len(conf.Plugins) != 2 || conf.Plugins[0].Type != "bridge" || !conf.Plugins[0].Hairpin {
		t.Fatalf("plugins %+v", conf.Plugins)
	}
	ipam := conf.Plugins[0].IPAM
	type rng struct{ subnet, gw string }
	var got []rng
	for _, r := range ipam.Ranges {
		for _, s := range r {
			got = append(got, rng{s.Subnet, s.Gateway})
		}
	}
	want := []rng{{"198.19.65.0/24", "198.19.65.1"}, {"2001:2:0:101::/64", "2001:2:0:101::1"}}
	if !slices.Equal(got, want) || len(ipam.Ranges) != 2 {
		t.Errorf("ranges %v, want %v, one set each", ipam.Ranges, want)
	}
	var dsts []string
	for _, r := range ipam.Routes {
		dsts = append(dsts, r.Dst)
	}
	if !slices.Equal(dsts, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("routes %v", dsts)
	}
	if a, b := mainConflist(false, v4, v4.Addr().Next()), mainConflistRanges(false, []netip.Prefix{v4}); a != b {
		t.Errorf("one-family conflists differ:\n%s\n%s", a, b)
	}
}

// kube-controller-manager refuses --node-cidr-mask-size with two cluster
// CIDRs; the IPv6 ranges sit in the benchmarking range, clear of the
// sandbox's own IPv6 plan and of each other.
func TestNodeIPAMArgsDualStack(t *testing.T) {
	if got, want := nodeIPAMArgs(3, false), []string{"--allocate-node-cidrs=true", "--cluster-cidr=198.19.64.0/18", "--node-cidr-mask-size=24"}; !slices.Equal(got, want) {
		t.Errorf("single-stack: %v, want %v", got, want)
	}
	want := []string{"--allocate-node-cidrs=true", "--cluster-cidr=198.19.64.0/18,2001:2:0:100::/56",
		"--node-cidr-mask-size-ipv4=24", "--node-cidr-mask-size-ipv6=64"}
	if got := nodeIPAMArgs(3, true); !slices.Equal(got, want) {
		t.Errorf("dual-stack: %v, want %v", got, want)
	}
	if got := serviceCIDRsFlag("198.18.0.0/16", true); got != "--service-cluster-ip-range=198.18.0.0/16,2001:2::/112" {
		t.Errorf("service range flag %q", got)
	}
	// Node IPAM allows 16 bits between the cluster and the node mask.
	if d := NodeCIDRMaskSize6 - PodCIDR6.Bits(); d < 1 || d > 16 {
		t.Errorf("IPv6 node mask /%d of %s: %d bits apart", NodeCIDRMaskSize6, PodCIDR6, d)
	}
	ranges := []netip.Prefix{ServiceCIDR6, PodCIDR6, NodeLAN6, sandbox.ClusterCIDR6, sandbox.ClientLAN6, netip.PrefixFrom(sandbox.NodeIP6, 64).Masked()}
	for i, a := range ranges {
		if !sandbox.IPv6Range.Contains(a.Addr()) {
			t.Errorf("%s outside %s", a, sandbox.IPv6Range)
		}
		for _, b := range ranges[i+1:] {
			if a.Overlaps(b) {
				t.Errorf("%s overlaps %s", a, b)
			}
		}
	}
	if !sandbox.VIPRange6.Contains(ServiceCIDR6.Addr()) {
		t.Errorf("Services %s outside the sandbox's VIP range %s", ServiceCIDR6, sandbox.VIPRange6)
	}
	if got := nodeLANIP6(3); got != netip.MustParseAddr("2001:2:0:fc::3") || !NodeLAN6.Contains(LANHostIP6) {
		t.Errorf("node 3 at %s, lan host %s", got, LANHostIP6)
	}
}
