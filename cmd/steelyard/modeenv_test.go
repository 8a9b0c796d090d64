package main

import (
	"testing"
)

// explain, verify and cleanup take --mode and --iptables-mode from the
// environment the chart's DaemonSet sets, so an operator's verify in the
// agent's pod checks the agent's mode; a flag on the command line still
// wins, and without the variables the defaults are iptables and auto.
func TestModeDefaultsFromEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name               string
		env                map[string]string
		args               []string
		wantMode, wantIPTs string
	}{
		{"no environment", nil, nil, "iptables", "auto"},
		{"the DaemonSet's", map[string]string{envMode: "nftables", envIPTablesMode: "legacy"}, nil, "nftables", "legacy"},
		{"a flag wins", map[string]string{envMode: "nftables"}, []string{"--mode=ipvs"}, "ipvs", "auto"},
		{"empty is unset", map[string]string{envMode: ""}, nil, "iptables", "auto"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envMode, "")
			t.Setenv(envIPTablesMode, "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			for _, use := range []string{"verify", "explain", "cleanup"} {
				root := newRootCommand()
				cmd, _, err := root.Find([]string{use})
				if err != nil || cmd.Name() != use {
					t.Fatalf("no %s command: %v", use, err)
				}
				if err := cmd.ParseFlags(tc.args); err != nil {
					t.Fatal(err)
				}
				mode, _ := cmd.Flags().GetString("mode")
				ipts, _ := cmd.Flags().GetString("iptables-mode")
				if mode != tc.wantMode || ipts != tc.wantIPTs {
					t.Errorf("%s: --mode %q --iptables-mode %q, want %q %q", use, mode, ipts, tc.wantMode, tc.wantIPTs)
				}
			}
		})
	}
}
