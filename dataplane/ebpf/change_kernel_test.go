//go:build e2e

package ebpf

import (
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// kernelChangeServices is the size of TestKernelChangeToMap: large enough
// for the nftables half's transaction to cost more than the map write,
// small enough to stay well under a minute on the loaded machine.
const kernelChangeServices = 2000

// TestKernelChangeToMap runs the ebpf mode's Sync against the real kernel
// (as root, in a throwaway network namespace it creates): the nftables
// half over netlink in that namespace, and the socket programs' maps
// created by the kernel from the committed object but neither pinned nor
// attached to anything (no program is loaded). At 2,000 Services x 10,
// with --count-connections, it changes one endpoint address 40 times in
// each order, interleaved, and checks that the map write of the maps-first
// order does not wait for the nftables half (its median time from Sync's
// start to the changed port's services update is below the old order's),
// and that after the partial syncs the kernel's services, slots and counts
// maps hold exactly what a full sync of the final state wants.
func TestKernelChangeToMap(t *testing.T) {
	if os.Getenv("STEELYARD_EBPF_NETNS") != "" {
		kernelChangeToMap(t)
		return
	}
	// A kernel test (tag e2e, run as root) must not pass by skipping.
	if os.Geteuid() != 0 {
		t.Fatal("needs root (runs itself in a throwaway network namespace): run it with sudo")
	}
	ns := "syeb" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", ns).Run() //nolint:errcheck
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run", "^TestKernelChangeToMap$", "-test.v", "-test.timeout", "3m")
	cmd.Env = append(os.Environ(), "STEELYARD_EBPF_NETNS="+ns)
	out, err := cmd.CombinedOutput()
	t.Logf("in %s:\n%s", ns, out)
	if err != nil {
		t.Fatal(err)
	}
}

func kernelChangeToMap(t *testing.T) {
	spec, err := loadSocklb()
	if err != nil {
		t.Fatal(err)
	}
	var objs socklbMaps
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatalf("create the maps: %v", err)
	}
	defer objs.Close()
	m := &maps{services: kernelMap{objs.Services}, slots: kernelMap{objs.Slots}, revnat: objs.Revnat,
		counts: kernelCounters{objs.Counts}, names: kernelMap{objs.Names},
		members: kernelMap{objs.Members}, affinity: objs.Affinity}
	cfg := nftables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}}}
	nft, err := nftables.NewDualStackKernel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	k := &kernel{m: m, cfg: Config{CountConnections: true}, read: func() (*maps, bool, error) { return m, true, nil }}
	d := k.dualStack(nft)
	defer func() {
		if err := nft.Cleanup(); err != nil {
			t.Errorf("nftables cleanup: %v", err)
		}
	}()

	s := benchState(kernelChangeServices)
	t0 := time.Now()
	if _, err := d.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	t.Logf("first sync of %d Services x 10: %v", kernelChangeServices, time.Since(t0).Round(time.Millisecond))

	sp := &s.Services[kernelChangeServices/2]
	key, _ := svcKeyOf(sp.VIP)
	stamp := &stampMap{bpfMap: m.services, key: key}
	m.services = stamp
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{sp.Name.Service(): true}}
	orig := sp.Backends[3].IP
	defer func(v bool) { nftFirst = v }(nftFirst)
	toMap := map[bool][]time.Duration{}
	whole := map[bool][]time.Duration{}
	for i := range 80 {
		// Each order gets new addresses and the original back in turn.
		nftFirst = (i/2)%2 == 0
		sp.Detach() // the record shares the synced Backends
		if i%2 == 0 {
			sp.Backends[3].IP = netip.AddrFrom4([4]byte{198, 19, 255, byte(1 + i)})
		} else {
			sp.Backends[3].IP = orig
		}
		stamp.at = time.Time{}
		start := time.Now()
		if _, err := d.Sync(s, req); err != nil {
			t.Fatal(err)
		}
		whole[nftFirst] = append(whole[nftFirst], time.Since(start))
		if stamp.at.IsZero() {
			t.Fatalf("change %d: the changed port's services entry was not written", i)
		}
		toMap[nftFirst] = append(toMap[nftFirst], stamp.at.Sub(start))
	}
	report := func(order string, first bool) float64 {
		p50 := quantileMs(toMap[first], 0.5)
		t.Logf("%s: change -> map p50 %.2f ms p99 %.2f ms; whole sync p50 %.2f ms (%d changes)", order,
			p50, quantileMs(toMap[first], 0.99), quantileMs(whole[first], 0.5), len(toMap[first]))
		return p50
	}
	old, now := report("nftables half first (before)", true), report("maps first", false)
	if now >= old {
		t.Errorf("maps first: change -> map p50 %.2f ms, not below the nftables-first order's %.2f ms", now, old)
	}

	// The kernel's maps after the partial syncs, against what a full sync
	// of the final state wants.
	m.services = stamp.bpfMap
	want := desiredTables(s)
	live, _, _, err := liveTables(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != len(want) {
		t.Errorf("%d services entries, want %d", len(live), len(want))
	}
	for key, w := range want {
		if l, ok := live[key]; !ok || !slices.Equal(l.slots, w.slots) {
			t.Errorf("%s: table %v, want %v", key.String(), l.slots, w.slots)
			break
		}
	}
	keys, _ := wantCounts(want)
	got := map[countKey]bool{}
	if err := m.counts.Each(func(k countKey, _ uint64) { got[k] = true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Errorf("%d counters, want %d", len(got), len(keys))
	}
	for k := range keys {
		if !got[k] {
			t.Errorf("no counter for %s -> %s", k.VIP, k.Backend.addrPort())
			break
		}
	}
}
