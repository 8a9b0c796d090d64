package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/dataplane"
)

// FuzzMasqueradeFlags parses random --cluster-cidr and --masquerade-bit
// values the way the command line does (pflag: CSV for the slice) and
// checks them like run does (dataplane.ParseMasquerade): never a panic; on success, every CIDR
// returned is a masked prefix that one of the values spells, and the bit is
// 0-31; otherwise an error naming the flag.
func FuzzMasqueradeFlags(f *testing.F) {
	for _, s := range [][2]string{
		{"198.19.0.0/16", "14"}, {"198.19.0.0/16,2001:2::/48", "0"}, {"", "31"}, {"198.19.1.2/16", "32"},
		{"198.19.0.0/33", "-1"}, {`"198.19.0.0/16,x"`, "0x1f"}, {"fe80::/10%eth0", "1e3"}, {"::ffff:198.19.0.0/112", "7"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, cidrs, bit string) {
		var dp dataplaneFlags
		cmd := &cobra.Command{Use: "run"}
		dp.register(cmd, true)
		if err := cmd.Flags().Parse([]string{"--cluster-cidr=" + cidrs, "--masquerade-bit=" + bit}); err != nil {
			if !strings.Contains(err.Error(), "cluster-cidr") && !strings.Contains(err.Error(), "masquerade-bit") {
				t.Fatalf("parse error does not name the flag: %v", err)
			}
			return
		}
		m, err := dataplane.ParseMasquerade(dp.clusterCIDRs, dp.masqueradeAll, dp.masqueradeBit)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "--cluster-cidr") && !strings.HasPrefix(err.Error(), "--masquerade-bit") {
				t.Fatalf("error does not name the flag: %v", err)
			}
			return
		}
		got := m.ClusterCIDRs
		if dp.masqueradeBit < 0 || dp.masqueradeBit > 31 {
			t.Fatalf("bit %d accepted", dp.masqueradeBit)
		}
		if len(got) > len(dp.clusterCIDRs) {
			t.Fatalf("%d CIDRs from %d values", len(got), len(dp.clusterCIDRs))
		}
		for _, p := range got {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("CIDR %s is not a masked prefix", p)
			}
			spelled := false
			for _, v := range dp.clusterCIDRs {
				if q, err := netip.ParsePrefix(v); err == nil && q.Masked() == p {
					spelled = true
				}
			}
			if !spelled {
				t.Fatalf("CIDR %s is none of the values %q", p, dp.clusterCIDRs)
			}
		}
	})
}
