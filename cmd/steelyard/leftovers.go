package main

import (
	"errors"
	"os/exec"
	"sync"

	"github.com/sirupsen/logrus"
	"github.com/vishvananda/netlink"

	"github.com/steelyard-net/steelyard/dataplane/ipvs"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// Which kernel API a mode's rules live in. Modes of one API share names
// (the IPVS mode keeps its masquerade and filter rules in STEELYARD-
// chains), so only the other API's leftovers are safe to remove while
// this mode runs: the split kube-proxy makes between its iptables-based
// modes and nftables.
const (
	rulesIPTables = "iptables"
	rulesNFTables = "nftables"
)

// leftoverCleaner removes, once, what modes of the other kernel API left
// on the node (a DaemonSet switched from --mode iptables to nftables, or
// back). Without it the old rules keep steering traffic beside the new
// ones until someone runs cleanup by hand.
type leftoverCleaner struct {
	once  sync.Once
	clean func() error
}

// newLeftoverCleaner returns the cleaner for a node running mode current,
// one of table (the modes table).
func newLeftoverCleaner(f *dataplaneFlags, current dataplaneMode, table []dataplaneMode) *leftoverCleaner {
	var others, siblings []dataplaneMode
	for _, m := range table {
		switch {
		case m.rules != current.rules:
			others = append(others, m)
		case m.name != current.name && m.ownLeftovers != nil:
			siblings = append(siblings, m)
		}
	}
	return &leftoverCleaner{clean: func() error {
		var errs []error
		// What a mode of the same API keeps outside it (the ebpf mode's
		// socket programs, which would go on steering connects).
		for _, m := range siblings {
			if err := m.ownLeftovers(f); err != nil {
				errs = append(errs, err)
			}
		}
		for _, m := range others {
			if m.present != nil && !m.present(f) {
				continue
			}
			if err := m.cleanup(f); err != nil {
				errs = append(errs, err)
				continue
			}
			log.WithFields(logrus.Fields{"mode": current.name, "removed": m.name}).Info("removed the rules another mode left on this node")
		}
		return errors.Join(errs...)
	}}
}

// afterSync wraps a sync function: once the first sync has succeeded (this
// mode's rules are in place, so no connection has a gap), the other API's
// leftovers are removed, in the runner's goroutine like every sync. A
// failure is logged and not retried: leftovers never stop the agent.
func (c *leftoverCleaner) afterSync(sync func() error) func() error {
	return func() error {
		if err := sync(); err != nil {
			return err
		}
		c.once.Do(func() {
			if err := c.clean(); err != nil {
				log.WithError(err).Warn("could not remove another mode's leftovers; run steelyard cleanup --mode <old mode>")
			}
		})
		return nil
	}
}

// ipvsPresent reports whether the IPVS mode ran here: it always creates
// its dummy interface. Checking that first keeps other modes from opening
// IPVS netlink (which can load the ip_vs module) on nodes that never ran it.
func ipvsPresent(*dataplaneFlags) bool {
	_, err := netlink.LinkByName(ipvs.DefaultInterface)
	return err == nil
}

// nftablesPresent reports whether the nftables mode left its tables here.
func nftablesPresent(*dataplaneFlags) bool { return nftables.TablesPresent() }

// iptablesPresent reports whether an iptables program is installed at all:
// without one, no iptables-based mode ran here (an nftables-only node).
func iptablesPresent(*dataplaneFlags) bool {
	for _, p := range []string{"iptables", "iptables-nft", "iptables-legacy"} {
		if _, err := exec.LookPath(p); err == nil {
			return true
		}
	}
	return false
}
