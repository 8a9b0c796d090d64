package ebpf

import (
	"context"
	"encoding"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/dataplanetest"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// benchState returns n Service ports with 10 endpoints each, sorted.
func benchState(n int) dataplane.State { return dataplanetest.Synthetic(n, 10) }

// stampMap notes when a Put writes key's entry (the services map: the
// moment a connect() sees the changed port's new table).
type stampMap struct {
	bpfMap
	key svcKey
	at  time.Time
}

func (m *stampMap) Put(key, value encoding.BinaryMarshaler) error {
	if k, ok := key.(svcKey); ok && k == m.key {
		m.at = time.Now()
	}
	return m.bpfMap.Put(key, value)
}

// discardNFT renders the nftables half's transactions and throws them
// away: steelyard's own share of that half, without a kernel (knftables'
// Fake compares each element with every other one, minutes at 30,000
// Services), and without the netlink write the real half adds.
type discardNFT struct{ knftables.Interface }

func (discardNFT) Run(context.Context, *knftables.Transaction) error { return nil }

// List answers that the table is there (nftables' check before a partial
// Sync) and holds nothing.
func (discardNFT) List(context.Context, string) ([]string, error) { return nil, nil }

// BenchmarkChangeToMap measures, per one-endpoint change (a new address,
// as bench-k8s makes) of one Service port among n x 10 endpoints, the
// time from the dual-stack Sync's start to the services map update that
// switches the changed port to its new table (map-p50/p99-ms), and the
// whole Sync (sync-p50-ms). The nftables half renders its transaction and
// discards it (discardNFT): its real cost is that plus a netlink write
// that grows with the cluster, so map-p50 of nft-first is a lower bound of
// what the map waited for before. order=nft-first is the order before the
// maps went first. counting=on is --count-connections (a counter per VIP
// and endpoint, a name per VIP).
func BenchmarkChangeToMap(b *testing.B) {
	for _, n := range []int{1000, 30000} {
		for _, counting := range []bool{false, true} {
			for _, first := range []bool{true, false} {
				order := "maps-first"
				if first {
					order = "nft-first"
				}
				on := map[bool]string{false: "off", true: "on"}[counting]
				b.Run(fmt.Sprintf("services=%d/counting=%s/order=%s", n, on, order), func(b *testing.B) {
					defer func(v bool) { nftFirst = v }(nftFirst)
					nftFirst = first
					benchChangeToMap(b, n, counting)
				})
			}
		}
	}
}

func benchChangeToMap(b *testing.B, n int, counting bool) {
	s := benchState(n)
	nft := nftables.NewDualStack(discardNFT{knftables.NewFake(knftables.IPv4Family, nftables.TableName)},
		discardNFT{knftables.NewFake(knftables.IPv6Family, nftables.TableName)}, nftables.Config{})
	d := NewDualStackMem(nft, counting)
	if _, err := d.Sync(s, dataplane.FullSync); err != nil {
		b.Fatal(err)
	}
	i := n / 2
	sp := &s.Services[i]
	key, _ := svcKeyOf(sp.VIP)
	m := d.Family(4).(*Proxier).k.m
	stamp := &stampMap{bpfMap: m.services, key: key}
	m.services = stamp
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sp.Name.Service(): true}}
	orig := sp.Backends[3].IP
	var toMap, whole []time.Duration
	k := 0
	for b.Loop() {
		// A new address for endpoint 3, then the original again.
		k++
		sp.Detach() // the record shares the synced Backends
		if k%2 == 1 {
			sp.Backends[3].IP = netip.AddrFrom4([4]byte{198, 19, 255, byte(1 + k%200)})
		} else {
			sp.Backends[3].IP = orig
		}
		stamp.at = time.Time{}
		t0 := time.Now()
		if _, err := d.Sync(s, req); err != nil {
			b.Fatal(err)
		}
		whole = append(whole, time.Since(t0))
		if stamp.at.IsZero() {
			b.Fatal("the changed port's services entry was not written")
		}
		toMap = append(toMap, stamp.at.Sub(t0))
	}
	b.ReportMetric(quantileMs(toMap, 0.5), "map-p50-ms")
	b.ReportMetric(quantileMs(toMap, 0.99), "map-p99-ms")
	b.ReportMetric(quantileMs(whole, 0.5), "sync-p50-ms")
}

// quantileMs returns the q quantile of ds in milliseconds (nearest rank).
func quantileMs(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = max(0, min(i, len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}
