package main

import (
	"slices"

	gnft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// probeCommits times two one-element transactions on the loaded table,
// each added and then deleted again, 5 times: an element with a goto
// verdict in service-ips (VIP 198.18.255.254:1/TCP, never used), and an
// address in nodeport-ips (198.19.255.254). It returns the median CPU
// seconds of the adds. The kernel validates the whole chain graph at the
// commit of a transaction that adds a jump or goto anywhere; the plain
// one shows what a commit costs without that walk.
func probeCommits() (verdict, plain float64) {
	table := &gnft.Table{Name: nftables.TableName, Family: gnft.TableFamilyIPv4}
	vip := []byte{198, 18, 255, 254, 6, 0, 0, 0, 0, 1, 0, 0} // addr . tcp . port 1, fields padded to 4 bytes
	ve := gnft.SetElement{Key: vip, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "reject-chain"}}
	vmap := &gnft.Set{Table: table, Name: "service-ips", IsMap: true}
	pe := gnft.SetElement{Key: []byte{198, 19, 255, 254}}
	pset := &gnft.Set{Table: table, Name: "nodeport-ips"}
	commit := func(f func(c *gnft.Conn) error) float64 {
		c, err := gnft.New()
		if err != nil {
			fail(err)
		}
		start := cpu()
		if err := f(c); err != nil {
			fail(err)
		}
		if err := c.Flush(); err != nil {
			fail(err)
		}
		return cpu() - start
	}
	var vs, ps []float64
	for range 5 {
		vs = append(vs, commit(func(c *gnft.Conn) error { return c.SetAddElements(vmap, []gnft.SetElement{ve}) }))
		commit(func(c *gnft.Conn) error { return c.SetDeleteElements(vmap, []gnft.SetElement{{Key: vip}}) })
		ps = append(ps, commit(func(c *gnft.Conn) error { return c.SetAddElements(pset, []gnft.SetElement{pe}) }))
		commit(func(c *gnft.Conn) error { return c.SetDeleteElements(pset, []gnft.SetElement{pe}) })
	}
	slices.Sort(vs)
	slices.Sort(ps)
	return vs[2], ps[2]
}
