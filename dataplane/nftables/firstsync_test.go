package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	gnft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// TestCommitBatchSendsElementsOverNetlink: a batch of a sync into an empty
// table commits its objects and rules through nft without any element,
// then its elements over netlink: weight maps and hairpin before the
// entry points, at most maxElemsPerMessage per message and
// maxElemsPerCommit per commit (a weight-map range is two kernel
// elements, its start and its end, kept in one message); deletions stay
// with nft, and the "return" of an affinity port's reject share goes over
// netlink like the others.
func TestCommitBatchSendsElementsOverNetlink(t *testing.T) {
	f := famOf(4)
	tcp := protoNumbers["tcp"]
	fake := &countNFT{Interface: knftables.NewFake(f.nfFamily, TableName)}
	p := NewProxier(fake, Config{Family: 4})
	p.netlink = newNetlinkWriter(4)
	var commits [][]string // per commit: "set:elements" per message
	p.netlink.opts = []gnft.ConnOption{gnft.WithTestDial(func(reqs []netlink.Message) ([]netlink.Message, error) {
		var msgs []string
		for _, m := range reqs {
			if m.Header.Type != netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM) {
				continue
			}
			msgs = append(msgs, elemMessage(t, m.Data[4:]))
		}
		if len(msgs) > 0 {
			commits = append(commits, msgs)
		}
		return ackAll(reqs)
	})}

	tx := &ops{}
	vip := func(i int) svcKey { return svcKey{netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), tcp, 80} }
	tx.Add(&knftables.Table{}) // only nft writes the table
	tx.Add(&knftables.Chain{Name: "svc-x"})
	tx.AddRule("svc-x", nil, r(l4proto(tcp), numgenDNAT{Buckets, 0, "dn-0001"}))
	tx.AddElem(sharedElem{elem{mapServiceIPs, vip(1), goTo("svc-x"), ""}, knftables.PtrTo("default/x:http")})
	for i := range 1200 {
		tx.AddElem(mapElem{"dn-0001", tcp, &wmElem{lo: uint32(i), hi: uint32(i), dnat: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), 8080)}})
	}
	tx.AddElem(newHairpinKey(netip.MustParseAddr("198.19.0.1"), tcp, 8080))
	tx.AddElem(mapElem{"wv-0002", tcp, &wmElem{lo: 5, hi: 9, to: vReturn}})
	tx.DeleteElem(mapElem{"dn-0001", tcp, &wmElem{lo: 7000, hi: 7000}})
	if err := p.commitBatch(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200", "dn-0001:200"},
		{"dn-0001:200", "dn-0001:200", "hairpin:1", "wv-0002:2"},
		{"service-ips:1"},
	}
	if fmt.Sprint(commits) != fmt.Sprint(want) {
		t.Errorf("netlink commits:\n%v\nwant\n%v", commits, want)
	}
	// nft got the table, the chain, the rule and the deletion, and no
	// element.
	if fmt.Sprint(fake.runs) != "[4]" {
		t.Errorf("nft runs of %v operations, want [4] (table, chain, rule, deletion)", fake.runs)
	}
}

// countNFT records the operations of each nft run and runs none.
type countNFT struct {
	knftables.Interface
	runs []int
}

func (d *countNFT) Run(_ context.Context, tx *knftables.Transaction) error {
	d.runs = append(d.runs, tx.NumOperations())
	return nil
}

// elemMessage is "set:count" of a NEWSETELEM message's attributes.
func elemMessage(t *testing.T, b []byte) string {
	t.Helper()
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatal(err)
	}
	var set string
	n := 0
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_SET_ELEM_LIST_SET:
			set = strings.TrimRight(ad.String(), "\x00")
		case unix.NFTA_SET_ELEM_LIST_ELEMENTS:
			ad.Nested(func(nd *netlink.AttributeDecoder) error {
				for nd.Next() {
					n++
				}
				return nil
			})
		}
	}
	if err := ad.Err(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s:%d", set, n)
}
