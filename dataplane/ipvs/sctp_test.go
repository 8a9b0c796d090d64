package ipvs

import (
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// SCTP Services: IPVS virtual servers of protocol SCTP (IPPROTO_SCTP) on
// the clusterIP and each node address, ipset members "ip,sctp:port", and a
// TCP Service on the same address and port number kept apart from it.
func TestSCTPEntryPoints(t *testing.T) {
	k := newTestKernel(t)
	k.cfg.NodeAddresses = nodeAddrs("198.19.254.1")
	k.restart()
	sig := svc("sig", "198.18.0.40", 2905, dataplane.SCTP, be("198.19.30.2:2905", 10), be("198.19.30.3:2905", 90))
	sig.NodePort = 30905
	ctl := svc("ctl", "198.18.0.40", 2905, dataplane.TCP, be("198.19.30.2:2905", 1))
	st := state(sig, ctl)
	k.sync(t, st, true)

	dump := k.ipvs.Dump()
	for _, want := range []string{
		"SCTP 198.18.0.40:2905 wrr\n  -> 198.19.30.2:2905 10\n  -> 198.19.30.3:2905 90\n",
		"SCTP 198.19.254.1:30905 wrr\n  -> 198.19.30.2:2905 10\n  -> 198.19.30.3:2905 90\n",
		"TCP 198.18.0.40:2905 wrr\n  -> 198.19.30.2:2905 1\n",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("IPVS table lacks\n%s\n%s", want, dump)
		}
	}
	members := func(set string) []string {
		es, _ := k.sets.Entries(set)
		var out []string
		for _, e := range es {
			out = append(out, e.Member)
		}
		return out
	}
	for set, want := range map[string]string{
		SetVIPs:     "198.18.0.40,sctp:2905",
		SetExternal: "198.19.254.1,sctp:30905",
		// Hairpin: a pod reaching itself through the VIP is masqueraded.
		SetLoopback: "198.19.30.3,sctp:2905,198.19.30.3",
	} {
		if got := members(set); !slices.Contains(got, want) {
			t.Errorf("%s lacks %s: %v", set, want, got)
		}
	}
	if vip, ok := parseVIPMember("198.18.0.40,sctp:2905"); !ok || vip != sig.VIP {
		t.Errorf("parseVIPMember(sctp) = %v, %v; want %v", vip, ok, sig.VIP)
	}

	views, err := k.p.Explain()
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(st), views); len(diff) != 0 {
		t.Errorf("explain differs from the desired state:\n%s", strings.Join(diff, "\n"))
	}
	var b strings.Builder
	_ = dataplane.WriteViews(&b, views, "text")
	for _, want := range []string{
		"198.18.0.40:2905/SCTP  198.19.30.2:2905 10.00%  198.19.30.3:2905 90.00%  demo/sig:p",
		"0.0.0.0:30905/SCTP  198.19.30.2:2905 10.00%  198.19.30.3:2905 90.00%  demo/sig:p",
		"198.18.0.40:2905/TCP  198.19.30.2:2905 100.00%  demo/ctl:p",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, b.String())
		}
	}
	if protoNum(dataplane.SCTP) != syscall.IPPROTO_SCTP || protoNum(dataplane.UDP) != syscall.IPPROTO_UDP || protoNum(dataplane.TCP) != syscall.IPPROTO_TCP {
		t.Errorf("protoNum: SCTP %d UDP %d TCP %d", protoNum(dataplane.SCTP), protoNum(dataplane.UDP), protoNum(dataplane.TCP))
	}
}

// An SCTP association is a connection: as with TCP, a leaving destination
// is idle once no association is active, whatever IPVS keeps in its
// inactive count (SHUTDOWN states). kube-proxy deletes UDP and SCTP
// destinations at once; steelyard drains SCTP like TCP, so established
// associations keep their endpoint until they end or GracefulPeriod.
func TestGracefulDrainSCTP(t *testing.T) {
	k := newTestKernel(t)
	sig := svc("sig", "198.18.0.40", 2905, dataplane.SCTP, be("198.19.30.2:2905", 1), be("198.19.30.3:2905", 1))
	k.sync(t, state(sig), true)
	leaving := sig.Backends[0].Addr()
	k.ipvs.SetConns(sig.VIP, leaving, 2, 0)
	gone := svc("sig", "198.18.0.40", 2905, dataplane.SCTP, be("198.19.30.3:2905", 1))
	k.sync(t, state(gone), false)
	k.sync(t, state(gone), false)
	if !strings.Contains(k.ipvs.Dump(), "198.19.30.2:2905 0") {
		t.Fatalf("SCTP destination with active associations deleted:\n%s", k.ipvs.Dump())
	}
	k.ipvs.SetConns(sig.VIP, leaving, 0, 3)
	k.sync(t, state(gone), false)
	checkDump(t, k, "SCTP 198.18.0.40:2905 wrr\n  -> 198.19.30.3:2905 1\n")
}
