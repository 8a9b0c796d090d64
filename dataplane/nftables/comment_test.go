package nftables

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// longRoutePort is the Service port of conformance
// UDPRouteParentRefPortAndSectionName's third listener: its name is 136
// bytes, and nft refuses a transaction with a comment over 128, so every
// sync failed while the route existed. The Gateway address is an external
// IP (elements " external IP" longer still).
func longRoutePort() dataplane.ServicePort {
	sp := svcPort("udp-multi-listener-gateway", "198.18.0.30", 5302, dataplane.UDP, be("198.19.1.30", 8080, 1), be("198.19.1.31", 8080, 3))
	sp.Name = dataplane.ServicePortName{Namespace: "gateway-conformance-infra", Name: "udp-multi-listener-gateway",
		Port: "by-section-and-port/UDPRoute/gateway-conformance-infra/udp-echo-by-section-and-port"}
	sp.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.200.3")}
	return sp
}

var reCommentText = regexp.MustCompile(`comment "([^"]*)"`)

// TestLongNamesFitNft: every comment stays within nft's limit, and explain
// and verify still name the Service port (through SameName).
func TestLongNamesFitNft(t *testing.T) {
	p, nft := newTest(t, 4)
	sp := longRoutePort()
	if len(sp.Name.String()) <= dataplane.NftCommentMax {
		t.Fatalf("fixture name %q fits already", sp.Name)
	}
	s := dataplane.State{Services: []dataplane.ServicePort{sp, svcPort("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))}}
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if f, ok := nft.(*knftables.Fake); ok {
		n := 0
		for _, m := range reCommentText.FindAllStringSubmatch(f.Dump(), -1) {
			n++
			if len(m[1]) > dataplane.NftCommentMax {
				t.Errorf("comment of %d bytes: %q", len(m[1]), m[1])
			}
		}
		if n == 0 {
			t.Fatal("no comment in the table")
		}
	}
	live, err := p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, v := range live {
		if v.VIP == "198.18.0.30" || v.VIP == "198.18.200.3" {
			found++
			if !strings.HasPrefix(v.Service, "gateway-conformance-infra/udp-multi-listener-gateway:by-section") || !dataplane.SameName(v.Service, sp.Name.String()) {
				t.Errorf("%s: explain names it %q", v.Key(), v.Service)
			}
		}
		if v.VIP == "198.18.200.3" && v.Entry != dataplane.EntryExternalIP {
			t.Errorf("%s: entry %q, want %q (the comment's suffix)", v.Key(), v.Entry, dataplane.EntryExternalIP)
		}
	}
	if found != 2 {
		t.Errorf("explain shows %d entry points of the long-named port, want 2", found)
	}
	if diff := dataplane.Diff(dataplane.Expected(s), live); len(diff) > 0 {
		t.Errorf("verify disagrees:\n%s", strings.Join(diff, "\n"))
	}
	// A partial sync of a weight change keeps working.
	s.Services[0].Detach() // the record shares the synced Backends
	s.Services[0].Backends[0].Weight = 2
	if _, err := p.Sync(s, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sp.Name.Service(): true}}); err != nil {
		t.Fatal(err)
	}
}
