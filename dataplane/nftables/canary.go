package nftables

import (
	"context"
	"errors"
	"syscall"

	gnft "github.com/google/nftables"
)

// tableThere reports whether steelyard's table of this family still exists:
// the check each partial sync makes before writing only what changed. It
// answers true when it cannot tell (the sync then goes on as asked; a real
// problem fails the transaction, which forces a full sync anyway).
func (p *Proxier) tableThere(ctx context.Context) bool {
	if p.tableExists != nil {
		ok, err := p.tableExists()
		if err != nil {
			log.WithError(err).Debug("cannot check the table: going on")
			return true
		}
		return ok
	}
	// The fake (and the nft binary without netlink): listing a missing
	// table's chains fails with "not found".
	_, err := p.nft.List(ctx, "chains")
	return !isNotFound(err)
}

// netlinkTableExists asks the kernel for the one table by name over
// netlink: a single small message, whatever the table holds (listing its
// chains or sets would cost time that grows with the Services).
func netlinkTableExists(family int) func() (bool, error) {
	fam := gnft.TableFamilyIPv4
	if family == 6 {
		fam = gnft.TableFamilyIPv6
	}
	return func() (bool, error) {
		c, err := gnft.New()
		if err != nil {
			return false, err
		}
		defer c.CloseLasting() //nolint:errcheck // a non-lasting conn closes nothing
		if _, err := c.ListTableOfFamily(TableName, fam); err != nil {
			if errors.Is(err, syscall.ENOENT) || isNotFound(err) {
				return false, nil
			}
			return false, err
		}
		return true, nil
	}
}

// TablesPresent reports whether steelyard's table of either family is in
// this network namespace (two small netlink messages; false where nftables
// netlink is unusable). Other modes use it to find this mode's leftovers
// without needing the nft binary.
func TablesPresent() bool {
	for _, family := range []int{4, 6} {
		if ok, err := netlinkTableExists(family)(); err == nil && ok {
			return true
		}
	}
	return false
}
