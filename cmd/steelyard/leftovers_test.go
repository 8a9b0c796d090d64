package main

import (
	"errors"
	"slices"
	"testing"
)

// TestLeftoverCleanerCrossesKernelAPIs checks which modes' leftovers each
// running mode removes (only the other kernel API's, as kube-proxy), that
// it happens once, only after a successful sync, and that a failing
// cleanup never fails the sync.
func TestLeftoverCleanerCrossesKernelAPIs(t *testing.T) {
	for _, tc := range []struct {
		current string
		want    []string
	}{
		{"iptables", []string{"nftables", "ebpf"}},
		{"ipvs", []string{"nftables", "ebpf"}},
		{"nftables", []string{"ebpf (own)", "iptables", "ipvs"}},
		{"ebpf", []string{"iptables", "ipvs"}},
	} {
		t.Run(tc.current, func(t *testing.T) {
			var cleaned []string
			table := slices.Clone(modes)
			for i := range table {
				name := table[i].name
				table[i].present = nil
				table[i].cleanup = func(*dataplaneFlags) error {
					cleaned = append(cleaned, name)
					if name == "ipvs" {
						return errors.New("no ipset here")
					}
					return nil
				}
				if table[i].ownLeftovers != nil {
					table[i].ownLeftovers = func(*dataplaneFlags) error {
						cleaned = append(cleaned, name+" (own)")
						return nil
					}
				}
			}
			current, err := lookupMode(tc.current)
			if err != nil {
				t.Fatal(err)
			}
			c := newLeftoverCleaner(&dataplaneFlags{}, current, table)
			fail := true
			sync := c.afterSync(func() error {
				if fail {
					return errors.New("sync failed")
				}
				return nil
			})
			if err := sync(); err == nil {
				t.Fatal("the failed sync's error was lost")
			}
			if len(cleaned) != 0 {
				t.Fatalf("cleaned %v before any sync succeeded: the old rules must serve until the new ones are in", cleaned)
			}
			fail = false
			for range 3 {
				if err := sync(); err != nil {
					t.Fatalf("sync: %v (a cleanup failure must not fail the sync)", err)
				}
			}
			if !slices.Equal(cleaned, tc.want) {
				t.Errorf("cleaned %v, want %v, once", cleaned, tc.want)
			}
		})
	}
}

// TestLeftoverCleanerSkipsAbsentModes checks that a mode whose present
// says it never ran here is not cleaned (no IPVS netlink, no nft binary
// needed on nodes that never ran them).
func TestLeftoverCleanerSkipsAbsentModes(t *testing.T) {
	var cleaned []string
	table := slices.Clone(modes)
	for i := range table {
		name := table[i].name
		table[i].present = func(*dataplaneFlags) bool { return name != "ipvs" }
		table[i].cleanup = func(*dataplaneFlags) error { cleaned = append(cleaned, name); return nil }
		table[i].ownLeftovers = nil
	}
	current, _ := lookupMode("nftables")
	if err := newLeftoverCleaner(&dataplaneFlags{}, current, table).afterSync(func() error { return nil })(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cleaned, []string{"iptables"}) {
		t.Errorf("cleaned %v, want only iptables", cleaned)
	}
}
