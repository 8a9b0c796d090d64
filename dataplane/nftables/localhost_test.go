package nftables

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

func localhostProxier(nft knftables.Interface, on bool, family int) *Proxier {
	cfg := testCfg
	cfg.LocalhostNodePorts, cfg.Family = on, family
	return NewProxier(nft, cfg)
}

func localhostNP() dataplane.State {
	sp := svcPort("web", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
	sp.NodePort = 30080
	return dataplane.State{Services: []dataplane.ServicePort{sp}}
}

func chainRules(t *testing.T, nft knftables.Interface, chain string) []string {
	t.Helper()
	rules, err := nft.ListRules(context.Background(), chain)
	if err != nil {
		t.Fatalf("list %s: %v", chain, err)
	}
	var out []string
	for _, r := range rules {
		out = append(out, r.Rule)
	}
	return out
}

func hasRule(rules []string, want string) bool {
	for _, r := range rules {
		if r == want {
			return true
		}
	}
	return false
}

func TestLocalhostNodePortRules(t *testing.T) {
	nft := knftables.NewFake(knftables.IPv4Family, TableName)
	p := localhostProxier(nft, true, 4)
	if _, err := p.Sync(localhostNP(), dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	lo := "ip saddr 127.0.0.0/8 ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @"
	svc := chainRules(t, nft, chainServices)
	// After the node addresses' lookup: a VIP or a node address wins.
	if len(svc) == 0 || svc[len(svc)-1] != lo+mapServiceNodePorts {
		t.Errorf("services chain: %q, want the loopback node port lookup last", svc)
	}
	if !hasRule(chainRules(t, nft, chainFilterEndpoints), lo+mapNoEndpointNodePorts) {
		t.Errorf("filter-endpoints: no loopback lookup of node ports without endpoints")
	}
	in := chainRules(t, nft, chainLocalnetInput)
	if len(in) != 1 || !strings.HasPrefix(in[0], "ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ") || !strings.HasSuffix(in[0], " drop") {
		t.Errorf("localnet-input: %q, want the martian drop", in)
	}
	// Traced: the node reaches the node port on 127.0.0.1, masqueraded
	// (the endpoint could not answer a loopback source); a packet from
	// elsewhere to 127.0.0.1 is dropped (CVE-2020-8558).
	lo1 := netip.MustParseAddr("127.0.0.1")
	tr := newTracer(t, nft, "198.19.200.1")
	ep := netip.MustParseAddrPort("198.19.1.2:8080")
	if o := tr.trace(pkt{src: lo1, dst: lo1, proto: "tcp", port: 30080, fromNode: true}); o.endpoints[ep] != 100 || !o.masq[ep] {
		t.Errorf("127.0.0.1:30080 from the node: %v, want %s masqueraded", o, ep)
	}
	if o := tr.trace(pkt{src: offCluster4, dst: lo1, proto: "tcp", port: 30080}); o.drop != 100 {
		t.Errorf("127.0.0.1:30080 from elsewhere: %v, want dropped", o)
	}
	dump := nft.Dump()
	if !strings.Contains(dump, "add chain ip steelyard "+chainLocalnetInput+" { type filter hook input priority 0 ; }") {
		t.Errorf("localnet-input is not an input base chain:\n%s", dump)
	}
	// A partial sync leaves the fixed rules alone; a full one keeps one copy.
	if _, err := p.Sync(localhostNP(), dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range chainRules(t, nft, chainServices) {
		if strings.Contains(r, "127.0.0.0/8") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("services chain has %d loopback rules after two full syncs, want 1:\n%s", n, nft.Dump())
	}

	// Restarted with --localhost-nodeports=false: all of it goes.
	off := localhostProxier(nft, false, 4)
	if _, err := off.Sync(localhostNP(), dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if dump := nft.Dump(); strings.Contains(dump, "127.0.0.0/8") || strings.Contains(dump, chainLocalnetInput) {
		t.Errorf("off: localhost rules left:\n%s", dump)
	}
	if o := newTracer(t, nft, "198.19.200.1").trace(pkt{src: lo1, dst: lo1, proto: "tcp", port: 30080, fromNode: true}); o.pass != 100 {
		t.Errorf("off: 127.0.0.1:30080 from the node: %v, want not forwarded", o)
	}
}

func TestLocalhostNodePortsNotIPv6(t *testing.T) {
	nft := knftables.NewFake(knftables.IPv6Family, TableName)
	sp := svcPort("web6", "2001:2::a", 80, dataplane.TCP, be("2001:2:0:1::2", 8080, 1))
	sp.NodePort = 30080
	if _, err := localhostProxier(nft, true, 6).Sync(dataplane.State{Services: []dataplane.ServicePort{sp}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if dump := nft.Dump(); strings.Contains(dump, "127.0.0.0/8") || strings.Contains(dump, chainLocalnetInput) {
		t.Errorf("ip6 table holds localhost rules:\n%s", dump)
	}
}
