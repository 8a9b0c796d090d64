//go:build e2e

package e2e

import (
	"slices"
	"strings"
	"testing"
)

// dpMode is one dataplane the kernel suite runs every case over: each case
// of kernelCases is a subtest per mode (TestKernel/<case>/<mode>).
type dpMode struct {
	name string
	// args select the mode in every steelyard command (run, explain,
	// verify, cleanup).
	args []string
	// flavour is the iptables flavour ("nft", "legacy") of an iptables
	// mode, "" for nftables.
	flavour string
}

// dpModes are the modes of the kernel suite. IPVS runs in the VM suite
// (test/ipvs): this kernel has no IPVS module.
var dpModes = []dpMode{
	{name: "iptables-legacy", args: []string{"--mode", "iptables", "--iptables-mode", "legacy"}, flavour: "legacy"},
	{name: "iptables-nft", args: []string{"--mode", "iptables", "--iptables-mode", "nft"}, flavour: "nft"},
	{name: "nftables", args: []string{"--mode", "nftables"}},
	// Its cgroup and pin dir are the suite's (ebpf_test.go, TestMain).
	{name: "ebpf", args: []string{"--mode", "ebpf"}},
}

// feature is something a case needs the dataplane to serve.
type feature string

// The features cases need beyond clusterIP forwarding by weight.
const (
	featNodePort     feature = "node ports"
	featExternalIP   feature = "external IPs"
	featLoadBalancer feature = "load-balancer IPs and loadBalancerSourceRanges"
	featLocalPolicy  feature = "Local traffic policies"
	featAffinity     feature = "sessionAffinity ClientIP"
)

// notYet is THE one place that says which features a mode does not serve
// yet: a case that needs one is skipped in that mode only, with
// "<mode>: not yet: ...". A new dataplane starts here with its gaps
// listed; docs/dataplanes.md says the same.
var notYet = map[string][]feature{}

// kernelCase is one row of the suite.
type kernelCase struct {
	name  string
	needs []feature
	run   func(t *testing.T, m dpMode)
}

// kernelCases is the one table of the kernel suite: every case runs in
// every mode of dpModes.
var kernelCases = []kernelCase{
	// shares_test.go
	{name: "TCPShares", run: caseTCPShares},
	{name: "WeightZeroGetsNothing", run: caseWeightZeroGetsNothing},
	{name: "UDPShares", run: caseUDPShares},
	{name: "OtherOrigins", run: caseOtherOrigins},
	// observed_test.go
	{name: "ObservedShares", run: caseObservedShares},
	// lifecycle_test.go
	{name: "EstablishedConnectionSurvivesRestartAndDrain", run: caseEstablishedConnectionSurvivesRestartAndDrain},
	{name: "RejectWithoutEndpoints", run: caseRejectWithoutEndpoints},
	{name: "Hairpin", run: caseHairpin},
	{name: "ResyncOnFileChange", run: caseResyncOnFileChange},
	{name: "ExplainVerifyAndRepair", run: caseExplainVerifyAndRepair},
	{name: "CleanupRemovesOnlySteelyard", run: caseCleanupRemovesOnlySteelyard},
	// canary_test.go
	{name: "PeriodicSyncRepairsFlushedTables", run: casePeriodicSyncRepairsFlushedTables},
	// parity_test.go
	{name: "NodePort", needs: []feature{featNodePort}, run: caseNodePort},
	{name: "NodePortUDP", needs: []feature{featNodePort}, run: caseNodePortUDP},
	{name: "ExternalIPsAndLoadBalancerSourceRanges", needs: []feature{featExternalIP, featLoadBalancer}, run: caseExternalIPsAndLoadBalancerSourceRanges},
	{name: "ExternalTrafficPolicyLocal", needs: []feature{featNodePort, featLocalPolicy}, run: caseExternalTrafficPolicyLocal},
	{name: "InternalTrafficPolicyLocal", needs: []feature{featLocalPolicy}, run: caseInternalTrafficPolicyLocal},
	{name: "TerminatingFallbackPerCategory", needs: []feature{featNodePort, featLocalPolicy}, run: caseTerminatingFallbackPerCategory},
	{name: "SessionAffinity", needs: []feature{featAffinity}, run: caseSessionAffinity},
	{name: "TopologyHints", run: caseTopologyHints},
	{name: "IPv6", run: func(t *testing.T, m dpMode) { caseIPv6(t, m, false) }},
	{name: "IPv6NodePort", needs: []feature{featNodePort}, run: func(t *testing.T, m dpMode) { caseIPv6(t, m, true) }},
	// localhost_nodeports_test.go
	{name: "LocalhostNodePort", needs: []feature{featNodePort, featAffinity}, run: caseLocalhostNodePort},
}

// TestKernel runs the table: each case, in each mode.
func TestKernel(t *testing.T) {
	for _, c := range kernelCases {
		t.Run(c.name, func(t *testing.T) {
			for _, m := range dpModes {
				t.Run(m.name, func(t *testing.T) {
					if missing := m.missing(c.needs); len(missing) > 0 {
						t.Skipf("%s: not yet: %s", m.name, strings.Join(missing, ", "))
					}
					c.run(t, m)
				})
			}
		})
	}
}

// missing returns the features of needs the mode does not serve yet.
func (m dpMode) missing(needs []feature) []string {
	var out []string
	for _, f := range needs {
		if slices.Contains(notYet[m.name], f) {
			out = append(out, string(f))
		}
	}
	return out
}

// modeNamed returns the mode of dpModes called name (suites that start the
// agent with arguments of their own still take the fixture of that mode).
func modeNamed(t *testing.T, name string) dpMode {
	t.Helper()
	for _, m := range dpModes {
		if m.name == name {
			return m
		}
	}
	t.Fatalf("no dataplane mode %q", name)
	return dpMode{}
}

// modeWithArgs returns the mode of dpModes whose arguments are args.
func modeWithArgs(t *testing.T, args []string) dpMode {
	t.Helper()
	for _, m := range dpModes {
		if slices.Equal(m.args, args) {
			return m
		}
	}
	t.Fatalf("no dataplane mode with arguments %q", args)
	return dpMode{}
}
