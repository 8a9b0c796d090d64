//go:build e2e

package nftables

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// TestSharedMapProtocolsKernel runs against the real kernel and nft (as
// root, in a throwaway network namespace it creates): a TCP, a UDP and an
// SCTP port whose split chains hash to one shared weight map are written
// (shard numbers equal) by a full sync and then one by one by partial
// syncs, in both orders,
// then by a restarted agent's full sync (through nft) and into an empty
// table.
// nft checks a DNAT rule's protocol against its map's typeof, so a map
// typed for one protocol refused the others' rules and failed every sync
// (the steelyard-ebpf conformance run of 2026-12-07).
func TestSharedMapProtocolsKernel(t *testing.T) {
	if inThrowawayNetns(t, "STEELYARD_PROTO_NETNS", "sypr") {
		sharedMapProtocols(t)
	}
}

// sameShardPorts returns a TCP, a UDP and an SCTP port of family whose
// split chains hash to one shard number (one shared map, when the maps
// were shared by every protocol), and that number ("0469").
func sameShardPorts(t *testing.T, family int) ([]dataplane.ServicePort, string) {
	t.Helper()
	cfg := testCfg
	cfg.Family = family
	p := NewProxier(knftables.NewFake(famOf(family).nfFamily, TableName), cfg)
	vip := func(i int) string {
		if family == 6 {
			return fmt.Sprintf("2001:2::%x", i+16)
		}
		return fmt.Sprintf("198.18.%d.%d", i/200, i%200+10)
	}
	bk := func(last int) dataplane.Backend {
		if family == 6 {
			return be(fmt.Sprintf("2001:2::1:%x", last), 8080, 1)
		}
		return be(fmt.Sprintf("198.19.1.%d", last), 8080, 1)
	}
	shard := func(sp dataplane.ServicePort) string {
		for m := range p.renderPort(&sp).maps {
			if sharedMap(m) {
				return m
			}
		}
		t.Fatalf("%s renders no shared map", sp.Name)
		return ""
	}
	first := svcPort("p0", vip(0), 53, dataplane.TCP, bk(2), bk(3))
	m := shard(first)[3:]
	out := []dataplane.ServicePort{first}
	for _, proto := range []dataplane.Protocol{dataplane.UDP, dataplane.SCTP} {
		for i := 1; ; i++ {
			if i > 100000 {
				t.Fatalf("no %s port hashes to shard %s", proto, m)
			}
			sp := svcPort(fmt.Sprintf("p%d", i), vip(i%40000), 53, proto, bk(4), bk(5))
			if shard(sp)[3:] == m {
				out = append(out, sp)
				break
			}
		}
	}
	return out, m
}

func sharedMapProtocols(t *testing.T) {
	for _, family := range []int{4, 6} {
		ports, m := sameShardPorts(t, family)
		for _, order := range [][]int{{0, 1, 2}, {2, 1, 0}} {
			cfg := testCfg
			cfg.Family = family
			p, err := NewKernel(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Cleanup(); err != nil {
				t.Fatal(err)
			}
			// The first port by a full sync, the others by partial ones.
			var s dataplane.State
			for k, i := range order {
				s.Services = append(s.Services, ports[i])
				s.Sort()
				req := dataplane.SyncRequest{}
				if k == 0 {
					req = dataplane.FullSync
				}
				if _, err := p.Sync(s, req); err != nil {
					t.Fatalf("IPv%d, order %v, %s added: %v", family, order, ports[i].VIP.Protocol, err)
				}
			}
			// A restarted agent's full sync over the table: its rules go
			// through nft, which checks each against its map's typeof.
			p1, err := NewKernel(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p1.Sync(s, dataplane.FullSync); err != nil {
				t.Fatalf("IPv%d, order %v, a restart's full sync: %v", family, order, err)
			}
			// And all three at once into a fresh table.
			if err := p.Cleanup(); err != nil {
				t.Fatal(err)
			}
			p2, err := NewKernel(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p2.Sync(s, dataplane.FullSync); err != nil {
				t.Fatalf("IPv%d, one full sync of the three: %v", family, err)
			}
			out, err := exec.Command("nft", "list", "table", string(famOf(family).nfFamily), TableName).CombinedOutput()
			if err != nil {
				t.Fatalf("nft list: %v: %s", err, out)
			}
			// Each protocol DNATs through its own map of that shard.
			for proto, pfx := range map[string]string{"tcp": sharedDNATPrefix, "udp": sharedUDPPrefix, "sctp": sharedSCTPPrefix} {
				rule := regexp.MustCompile(`meta l4proto ` + proto + ` dnat ` + famOf(family).ip + ` to numgen random mod \d+(?: offset \d+)? map @` + pfx + m + `( comment "[^"]*")?\n`)
				if !rule.MatchString(string(out)) || !strings.Contains(string(out), "map "+pfx+m+" {") {
					t.Errorf("IPv%d: no %s DNAT through %s%s:\n%s", family, proto, pfx, m, out)
				}
			}
			if err := p2.Cleanup(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("IPv%d: a TCP, a UDP and an SCTP port of shard %s, synced in both orders, by a restart and at once", family, m)
	}
}
