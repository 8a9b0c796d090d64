// Command iptables-bench measures the iptables dataplane at scale in the
// network namespace it runs in (scripts/bench-iptables.sh makes one): render
// and apply N Services x M endpoints, then one endpoint change applied as a
// partial sync (changed chains only) and as a full sync. It prints a table
// and asserts nothing.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"text/tabwriter"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

func main() {
	services := flag.Int("services", 10000, "number of Services")
	endpoints := flag.Int("endpoints", 10, "endpoints per Service")
	mode := flag.String("iptables-mode", "auto", "nft, legacy or auto")
	quick := flag.Bool("quick", false, "skip the whole-ruleset restore row (iptables-nft at 10,000 Services needs many minutes for it)")
	flag.Parse()
	logrus.SetLevel(logrus.WarnLevel)

	state := makeState(*services, *endpoints)
	ipt, m, err := iptables.New(iptables.Mode(*mode))
	if err != nil {
		fail(err)
	}
	cfg := iptables.Config{Masquerade: dataplane.Masquerade{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("198.19.0.0/16")}}}
	p := iptables.NewProxier(ipt, cfg)

	start := time.Now()
	rules := iptables.Render(state, cfg)
	render := time.Since(start)

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "iptables (%s), %d Services x %d endpoints\t\n", m, *services, *endpoints)
	fmt.Fprintf(w, "step\twall time\tchains written\trules written\trestore input\t\n")
	fmt.Fprintf(w, "render (in memory)\t%s\t\t%d\t\t\n", render.Round(time.Millisecond), rules.Count())

	row := func(name string, full bool, s dataplane.State) {
		start := time.Now()
		if _, err := p.Sync(s, dataplane.SyncRequest{Full: full}); err != nil {
			fail(err)
		}
		st := p.LastSync
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d KiB\t\n", name, time.Since(start).Round(time.Millisecond),
			st.ChainsWritten, st.RulesWritten, st.RestoreBytes/1024)
	}
	row("first sync (full, empty kernel)", true, state)
	if !*quick {
		row("full resync, nothing changed", true, state)
	}

	// One endpoint of one Service changes weight.
	state.Services[*services/2].Backends[0].Weight = 7
	row("one endpoint change, changed chains only", false, state)
	state.Services[*services/2].Backends[0].Weight = 3
	row("one endpoint change, full sync (save, compare, write the diff)", true, state)
	if !*quick {
		// What a sync costs when it rewrites the whole ruleset in one
		// restore, as kube-proxy's full syncs do.
		state.Services[*services/2].Backends[0].Weight = 5
		start := time.Now()
		all := iptables.FullRestore(iptables.Render(state, cfg))
		if err := ipt.Restore(all); err != nil {
			fail(err)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d KiB\t\n", "one endpoint change, whole-ruleset restore", time.Since(start).Round(time.Millisecond),
			"all", rules.Count(), len(all)/1024)
	}

	start = time.Now()
	views, err := p.Explain()
	if err != nil {
		fail(err)
	}
	fmt.Fprintf(w, "explain (iptables-save + trace)\t%s\t\t\t%d VIPs\t\n", time.Since(start).Round(time.Millisecond), len(views))
	start = time.Now()
	if err := p.Cleanup(); err != nil {
		fail(err)
	}
	fmt.Fprintf(w, "cleanup\t%s\t\t\t\t\n", time.Since(start).Round(time.Millisecond))
	w.Flush()
}

// makeState builds n Services with m endpoints each. VIPs come from
// 198.18.0.0/16, endpoints from 198.19.0.0/16 (ports vary once the
// addresses run out).
func makeState(n, m int) dataplane.State {
	var s dataplane.State
	vipBase := netip.MustParseAddr("198.18.0.0").As4()
	for i := 0; i < n; i++ {
		vip := vipBase
		vip[2], vip[3] = byte((i+1)>>8), byte(i+1)
		sp := dataplane.ServicePort{
			Name: dataplane.ServicePortName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), Port: "http"},
			VIP:  dataplane.VIP{IP: netip.AddrFrom4(vip), Port: 80, Protocol: dataplane.TCP},
		}
		for j := 0; j < m; j++ {
			k := i*m + j
			ip := [4]byte{198, 19, byte((k % 65000) >> 8), byte(k % 65000)}
			sp.Backends = append(sp.Backends, dataplane.Backend{
				IP: netip.AddrFrom4(ip), Port: uint16(8080 + k/65000), Weight: float64(1 + j%4), Ready: true, Serving: true,
			})
		}
		s.Services = append(s.Services, sp)
	}
	s.Sort()
	return s
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "iptables-bench:", err)
	os.Exit(1)
}
