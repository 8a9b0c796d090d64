package main

// The tables of docs/bench-k8s.jsonl (`make bench-k8s`). Since
// 2026-12-07 each point names its run (run_id): a table shows the points
// of one run, the newest in the file, and every ratio is taken between
// points of that run only (two runs on a shared machine are not
// comparable). Points without a run id (earlier runs) are not rendered;
// docs/benchmarks.md describes them in its text.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
)

// k8sRun is the points of one run, in file order, the last point of each
// proxy and size kept.
type k8sRun struct {
	id     string
	points []point.Result
}

// readK8sRun reads the newest run of the file: the run id of its last
// point that has one.
func readK8sRun(path string) (k8sRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return k8sRun{}, err
	}
	defer f.Close()
	var all []point.Result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var p point.Result
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return k8sRun{}, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		all = append(all, p)
	}
	if err := sc.Err(); err != nil {
		return k8sRun{}, err
	}
	r := k8sRun{}
	for _, p := range all {
		if p.RunID != "" {
			r.id = p.RunID
		}
	}
	idx := map[string]int{}
	for _, p := range all {
		if p.RunID != r.id || r.id == "" {
			continue
		}
		if p.Commit == "" || p.Date == "" {
			return k8sRun{}, fmt.Errorf("%s: run %s: a point without commit or date (%s)", path, r.id, p.Dataplane)
		}
		k := fmt.Sprintf("%s|%d|%d", p.Proxy, p.Services, p.Endpoints)
		if i, ok := idx[k]; ok {
			r.points[i] = p
			continue
		}
		idx[k] = len(r.points)
		r.points = append(r.points, p)
	}
	return r, nil
}

// sizes are the run's sizes in the order they ran.
func (r k8sRun) sizes() [][2]int {
	var out [][2]int
	seen := map[[2]int]bool{}
	for _, p := range r.points {
		s := [2]int{p.Services, p.Endpoints}
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// find returns the run's point of proxy at size s.
func (r k8sRun) find(proxy string, s [2]int) *point.Result {
	for i := range r.points {
		p := &r.points[i]
		if p.Proxy == proxy && p.Services == s[0] && p.Endpoints == s[1] {
			return p
		}
	}
	return nil
}

// loads is the range of the run's load averages (the 1-minute figure at
// each point's end).
func (r k8sRun) loads() string {
	var ls []string
	for _, p := range r.points {
		if f := strings.Fields(p.LoadAvg); len(f) > 0 {
			ls = append(ls, f[0])
		}
	}
	if len(ls) == 0 {
		return "not recorded"
	}
	sort.Slice(ls, func(i, j int) bool { return atof(ls[i]) < atof(ls[j]) })
	return ls[0] + "-" + ls[len(ls)-1]
}

func atof(s string) float64 {
	var f float64
	fmt.Sscan(s, &f)
	return f
}

func (r k8sRun) head(root, dir string) string {
	p := r.points[0]
	return fmt.Sprintf("Run %s (%s; `make bench-k8s`, %s, one API server per size, each proxy alone; 1-minute load average %s at the points' ends)",
		r.id, run(p.Commit, p.Date), link(root, dir, benchK8s), r.loads())
}

func noRun(root, dir string) []string {
	return []string{fmt.Sprintf("No run with a run id in %s yet: `make bench-k8s` writes one, `make docs` renders it here.", link(root, dir, benchK8s))}
}

// ratio is a/b as "0.42x", "-" when either is missing.
func ratio(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// Proxy names of k8s-bench's -proxies.
const (
	kpNFT    = "kube-proxy-nftables"
	kpNFT250 = "kube-proxy-nftables-msp250ms"
	syNFT    = "steelyard-nftables"
	syEBPF   = "steelyard-ebpf"
)

func p99(p *point.Result) float64 {
	if p == nil {
		return 0
	}
	return p.ChangeP99
}

func field(p *point.Result, f func(*point.Result) float64) float64 {
	if p == nil {
		return 0
	}
	return f(p)
}

// renderBenchK8s is the README's summary of the newest run: per size,
// change -> kernel p99, first sync and peak RSS of steelyard's nftables
// and ebpf modes beside kube-proxy nftables at steelyard's
// --min-sync-period (250 ms) and at its own default (1 s).
func renderBenchK8s(root, dir, file string) ([]string, error) {
	r, err := readK8sRun(filepath.Join(root, benchK8s))
	if err != nil {
		return nil, err
	}
	if r.id == "" {
		return noRun(root, dir), nil
	}
	out := []string{
		"| Services x endpoints | change -> kernel p99: steelyard nftables / ebpf / kube-proxy nftables at 250 ms / at 1 s | first sync: steelyard nftables / ebpf / kube-proxy (250 ms) | peak RSS: steelyard nftables / ebpf / kube-proxy (250 ms) |",
		"|---|---|---|---|",
	}
	for _, s := range r.sizes() {
		sn, se, k250, k1 := r.find(syNFT, s), r.find(syEBPF, s), r.find(kpNFT250, s), r.find(kpNFT, s)
		if sn == nil && se == nil && k250 == nil && k1 == nil {
			continue
		}
		first := func(p *point.Result) float64 { return p.First }
		rss := func(p *point.Result) float64 { return p.RSSMiB }
		out = append(out, fmt.Sprintf("| %s x %d | %s / %s / %s / %s | %s / %s / %s | %s / %s / %s |",
			count(s[0]), s[1], dur(p99(sn)), dur(p99(se)), dur(p99(k250)), dur(p99(k1)),
			dur(field(sn, first)), dur(field(se, first)), dur(field(k250, first)),
			mibOr(field(sn, rss)), mibOr(field(se, rss)), mibOr(field(k250, rss))))
	}
	return append(out, "", r.head(root, dir)+": generated by `make docs`; every column, CPU and explain in "+
		link(root, dir, "docs/benchmarks.md")+"."), nil
}

func mibOr(v float64) string {
	if v <= 0 {
		return "-"
	}
	return mib(v)
}

// renderBenchK8sRun is docs/benchmarks.md's table of the newest run:
// every proxy and size with every column, then the issues' ratios, each
// within the run.
func renderBenchK8sRun(root, dir, file string) ([]string, error) {
	r, err := readK8sRun(filepath.Join(root, benchK8s))
	if err != nil {
		return nil, err
	}
	if r.id == "" {
		return noRun(root, dir), nil
	}
	out := []string{
		r.head(root, dir) + ", generated by `make docs`:",
		"",
		"| Services x endpoints | proxy | --min-sync-period | first sync (CPU-s) | change -> kernel p50 / p99 (changes) | CPU per change | CPU total | peak RSS | explain (CPU-s) | maps memlock | load (1 / 5 / 15 min) |",
		"|---|---|---|---|---|---|---|---|---|---|---|",
	}
	for _, s := range r.sizes() {
		for _, p := range r.points {
			if p.Services != s[0] || p.Endpoints != s[1] {
				continue
			}
			lat := "-"
			if p.Changes > 0 {
				lat = fmt.Sprintf("%s / %s (%d)", dur(p.ChangeP50), dur(p.ChangeP99), p.Changes)
			}
			expl := withCPU(p.Explain, p.ExplainCPU)
			if p.ExplainCmd != "" && !strings.HasPrefix(p.ExplainCmd, "steelyard") {
				expl += " `" + p.ExplainCmd + "`"
			}
			mem := "-"
			if p.MapsMemlock > 0 {
				mem = fmt.Sprintf("%.1f MiB", float64(p.MapsMemlock)/(1<<20))
			}
			cpc := "-"
			if p.ChangeCPU > 0 {
				cpc = fmt.Sprintf("%.3f CPU-s", p.ChangeCPU)
			}
			tot := "-"
			if p.TotalCPU > 0 {
				tot = fmt.Sprintf("%.1f CPU-s", p.TotalCPU)
			}
			out = append(out, fmt.Sprintf("| %s x %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
				count(s[0]), s[1], strings.TrimSuffix(p.Dataplane, " (API server)"), p.MinSyncPeriod, withCPU(p.First, p.FirstCPU),
				lat, cpc, tot, mib(p.RSSMiB), expl, mem, load(p.LoadAvg)))
		}
	}
	out = append(out, "", "Ratios within the run (steelyard / kube-proxy, same size; kube-proxy nftables at steelyard's --min-sync-period of 250 ms):", "",
		"| Services x endpoints | steelyard | change p99 | first sync | peak RSS | CPU total |",
		"|---|---|---|---|---|---|")
	for _, s := range r.sizes() {
		for _, pr := range [][3]string{{syNFT, kpNFT250, "nftables"}, {syEBPF, kpNFT250, "ebpf"}, {"steelyard", "kube-proxy-iptables", "iptables (against kube-proxy iptables, 1 s)"}} {
			a, b := r.find(pr[0], s), r.find(pr[1], s)
			if a == nil || b == nil {
				continue
			}
			out = append(out, fmt.Sprintf("| %s x %d | %s | %s | %s | %s | %s |", count(s[0]), s[1], pr[2],
				ratio(a.ChangeP99, b.ChangeP99), ratio(a.First, b.First), ratio(a.RSSMiB, b.RSSMiB), ratio(a.TotalCPU, b.TotalCPU)))
		}
	}
	return append(out, "",
		"change -> kernel: the API write to the kernel's netlink event adding the address (nftables, iptables: the end of the first sync after which it is in the rules read back); steelyard ebpf: to the first 1 ms poll of the changed port's pinned map entries that finds it, in runs of 7351e47 and later; runs before it (this bench's monitor was not given the maps) timed the end of the first sync after which the maps held it, an upper bound (its agent writes the nftables half, every entry point with the clusterIPs, in the same sync: before the maps up to b52a97c, after them since). "+
			"Bursts: kube-proxy lets 2 syncs run back to back before its period holds them apart (fixed); steelyard's `--sync-burst` is 8 from c45163e (2 before), so at an equal --min-sync-period a short run of changes waits less in steelyard (docs/benchmarks.md, the runner's burst). "+
			"CPU: the proxy and its children, from /proc; per change: during the changes / changes; total: start to the end of the quiet period. "+
			"explain: `steelyard explain --mode X` in the namespace after the run; kube-proxy has no explain, so its ruleset listed (the command is named), the nearest equivalent. "+
			"maps memlock: the kernel's memory of the ebpf mode's pinned maps (fdinfo)."), nil
}

// renderBenchK8sEarlier is the table of the points written before runs had
// ids (the runs docs/benchmarks.md describes in its text): the last point
// of each proxy and size, each with its own commit and load.
func renderBenchK8sEarlier(root, dir, file string) ([]string, error) {
	ps, err := readPoints(filepath.Join(root, benchK8s))
	if err != nil {
		return nil, err
	}
	out := []string{
		"| Services x endpoints | proxy | first sync | change -> kernel p50 / p99 | peak RSS | load | run |",
		"|---|---|---|---|---|---|---|",
	}
	for _, p := range ps {
		if p.RunID != "" {
			continue
		}
		out = append(out, fmt.Sprintf("| %s x %d | %s | %s | %s / %s | %s | %s | %s |",
			count(p.Services), p.Endpoints, strings.TrimSuffix(p.Dataplane, " (API server)"),
			withCPU(p.First, p.FirstCPU), dur(p.ChangeP50), dur(p.ChangeP99), mib(p.RSSMiB), load(p.LoadAvg), run(p.Commit, p.Date)))
	}
	return append(out, "",
		fmt.Sprintf("Generated by `make docs` from %s (`make bench-k8s`; the points written before runs had ids, the last of each proxy and size): CPU seconds of the first sync in brackets, load average at the end of the point's run.", link(root, dir, benchK8s))), nil
}
