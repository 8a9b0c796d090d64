//go:build e2e

package iptables

// A kernel test (root; make e2e): the endpoint counts are the DNAT rules'
// own counters, and the kernel keeps them while restores rewrite other
// chains, in both iptables flavours. Runs on a thread moved into a network
// namespace of its own (unshare): nothing mounted, gone with the thread.
// Test IP plan:
//
//	198.18.0.70:53 UDP -> 198.19.7.2:5353, 198.19.7.3:5353 (weights 1, 3)
//	198.18.0.71:53 UDP -> 198.19.7.4:5353, the Service that changes

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/dataplane"
)

// inNetns runs f on a thread in a new, empty network namespace (its
// children, iptables included, too). The thread stays locked, so the
// runtime ends it, and the namespace with it, when the goroutine returns.
func inNetns(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

func TestKernelEndpointCounts(t *testing.T) {
	for _, mode := range []Mode{ModeLegacy, ModeNFT} {
		t.Run(string(mode), func(t *testing.T) {
			if err := inNetns(func() error { return endpointCounts(t, mode) }); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func endpointCounts(t *testing.T, mode Mode) error {
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "198.19.7.2/32", "dev", "lo"}, {"addr", "add", "198.19.7.3/32", "dev", "lo"}, {"addr", "add", "198.19.7.4/32", "dev", "lo"}, {"route", "add", "198.18.0.0/16", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %w: %s", args, err, out)
		}
	}
	ipt, _, err := New(mode)
	if err != nil {
		return err
	}
	cfg := Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}}, CountConnections: true}
	p := NewProxier(ipt, cfg)
	counted := svcPort("ns", "counted", "dns", "198.18.0.70", 53, dataplane.UDP, be("198.19.7.2", 5353, 1), be("198.19.7.3", 5353, 3))
	other := svcPort("ns", "other", "dns", "198.18.0.71", 53, dataplane.UDP, be("198.19.7.4", 5353, 1))
	sync := func(req dataplane.SyncRequest) error {
		_, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{counted, other}}, req)
		return err
	}
	if err := sync(dataplane.FullSync); err != nil {
		return err
	}
	defer p.Cleanup()
	// 400 flows, each from a source port of its own (a new conntrack
	// entry: the nat table sees its first packet; an ephemeral port could
	// repeat, and its datagram would not be a new connection).
	const flows = 400
	vip := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.18.0.70:53"))
	for i := 0; i < flows; i++ {
		c, err := net.DialUDP("udp4", &net.UDPAddr{Port: 20000 + i}, vip)
		if err != nil {
			return err
		}
		_, err = c.Write([]byte("x"))
		c.Close()
		if err != nil {
			return err
		}
	}
	read := func(what string) (map[string]uint64, error) {
		counts, err := p.Counts()
		if err != nil {
			return nil, err
		}
		m := map[string]uint64{}
		var total uint64
		for _, c := range counts {
			if c.Service == "ns/counted:dns" {
				m[c.Endpoint.String()] = c.NewConnections
				total += c.NewConnections
			}
		}
		if len(m) != 2 || total != flows || m["198.19.7.2:5353"] == 0 || m["198.19.7.3:5353"] == 0 {
			return nil, fmt.Errorf("%s: counts %v (total %d), want %d over both endpoints", what, m, total, flows)
		}
		return m, nil
	}
	first, err := read("after the traffic")
	if err != nil {
		return err
	}
	t.Logf("%s: %v", mode, first)
	// The other Service changes twice (partial syncs), then a full sync
	// repairs a flushed STEELYARD-SERVICES: three restores that leave the
	// counted endpoint chains alone.
	changed := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{other.Name.Service(): true}}
	other.Detach() // the record shares the synced Backends
	other.Backends[0].Weight = 2
	if err := sync(changed); err != nil {
		return err
	}
	if p.LastSync.ChainsWritten == 0 {
		return fmt.Errorf("a weight change restored nothing")
	}
	other.Backends = append(other.Backends, be("198.19.7.5", 5353, 1))
	if err := sync(changed); err != nil {
		return err
	}
	// A hand edit for the full sync to repair.
	if err := ipt.Restore([]byte("*nat\n-F STEELYARD-SERVICES\nCOMMIT\n")); err != nil {
		return err
	}
	if err := sync(dataplane.FullSync); err != nil {
		return err
	}
	if p.LastSync.ChainsWritten == 0 {
		return fmt.Errorf("the full sync after a flush restored nothing")
	}
	after, err := read("after three restores of other chains")
	if err != nil {
		return err
	}
	for ep, n := range first {
		if after[ep] != n {
			return fmt.Errorf("%s counted %d, then %d after restores of other chains", ep, n, after[ep])
		}
	}
	return nil
}
