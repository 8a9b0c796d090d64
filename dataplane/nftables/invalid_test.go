package nftables

import (
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Forwarded packets in conntrack's invalid state are dropped (before the
// new-connection checks; kubernetes#74839), in both families, and a sync
// does not add the rule twice.
func TestForwardDropsInvalid(t *testing.T) {
	for _, fam := range []int{4, 6} {
		nftFam := knftables.IPv4Family
		if fam == 6 {
			nftFam = knftables.IPv6Family
		}
		nft := knftables.NewFake(nftFam, TableName)
		p := localhostProxier(nft, false, fam)
		for i := 0; i < 2; i++ {
			if _, err := p.Sync(dataplane.State{}, dataplane.FullSync); err != nil {
				t.Fatal(err)
			}
		}
		got := chainRules(t, nft, chainFilterForward)
		want := []string{"ct state new jump " + chainFilterEndpoints, "ct state invalid drop"}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("IPv%d filter-forward: %q, want %q", fam, got, want)
		}
	}
}
