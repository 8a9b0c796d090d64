package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/steelyard-net/steelyard/test/bench/node/result"
	"github.com/steelyard-net/steelyard/test/bench/scale/point"
	"github.com/steelyard-net/steelyard/test/conformance/summary"
)

// The committed data each table is rendered from, relative to the
// repository root.
const (
	benchK8s      = "docs/bench-k8s.jsonl"
	benchScale    = "docs/bench-scale.jsonl"
	benchObserved = "docs/bench-observed.jsonl"
	benchNode     = "docs/bench-node.json"
	gatewayGlob   = "docs/gateway-conformance-report*.yaml"
	conformanceGl = "docs/conformance/*.json"
)

// renderer renders one named region. root is the repository, dir the
// directory of the file the region is in (links are relative to it), file
// that file's path.
type renderer func(root, dir, file string) ([]string, error)

// renderers are the region names docsgen knows.
var renderers = map[string]renderer{
	"bench-k8s":           renderBenchK8s,
	"bench-k8s-run":       renderBenchK8sRun,
	"bench-k8s-earlier":   renderBenchK8sEarlier,
	"bench-scale":         renderBenchScale,
	"bench-observed":      renderBenchObserved,
	"bench-node":          renderBenchNode,
	"gateway-conformance": renderGateway,
	"conformance":         renderConformance,
}

// link is a markdown link to the repository path p from dir.
func link(root, dir, p string) string {
	rel, err := filepath.Rel(dir, filepath.Join(root, p))
	if err != nil {
		rel = p
	}
	return fmt.Sprintf("[%s](%s)", p, filepath.ToSlash(rel))
}

// run names the run a point came from; old points have no commit.
func run(commit, date string) string {
	if commit == "" {
		commit = "commit unknown"
	}
	if d, _, ok := strings.Cut(date, "T"); ok {
		date = d
	}
	if date == "" {
		return commit
	}
	return commit + ", " + date
}

// load prints a load average, "not recorded" when there is none.
func load(l string) string {
	if strings.TrimSpace(l) == "" {
		return "not recorded"
	}
	return l
}

// dur prints seconds with three significant figures (two below 1 ms), in
// ms below one second.
func dur(s float64) string {
	switch x := s * 1000; {
	case s <= 0:
		return "-"
	case x < 10:
		return fmt.Sprintf("%.2f ms", x)
	case x < 100:
		return fmt.Sprintf("%.1f ms", x)
	case s < 1:
		return fmt.Sprintf("%.0f ms", x)
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	case s < 100:
		return fmt.Sprintf("%.1f s", s)
	default:
		return fmt.Sprintf("%.0f s", s)
	}
}

// ms prints milliseconds as dur does.
func ms(v float64) string { return dur(v / 1000) }

// withCPU is a wall time and its CPU seconds in brackets.
func withCPU(wall, cpu float64) string {
	if wall <= 0 {
		return "-"
	}
	if cpu <= 0 {
		return dur(wall)
	}
	f := "%.4f"
	switch {
	case cpu >= 10:
		f = "%.1f"
	case cpu >= 1:
		f = "%.2f"
	case cpu >= 0.01:
		f = "%.3f"
	}
	return fmt.Sprintf("%s ("+f+" CPU-s)", dur(wall), cpu)
}

// count prints n with thousands separators.
func count(n int) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func mib(v float64) string { return fmt.Sprintf("%.0f MiB", math.Round(v)) }

// readPoints reads a jsonl file of point.Result, one a line, and keeps
// the last point of each dataplane, size and endpoint count, in the
// order of their first appearance sorted by size (as scale-plot does).
func readPoints(path string) ([]point.Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type key struct {
		dp      string
		svc, ep int
		count   bool
	}
	idx := map[key]int{}
	var out []point.Result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var p point.Result
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		k := key{p.Dataplane, p.Services, p.Endpoints, p.CountConnections}
		if i, ok := idx[k]; ok {
			out[i] = p
			continue
		}
		idx[k] = len(out)
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no points", path)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Services < out[j].Services })
	return out, nil
}

func renderBenchScale(root, dir, file string) ([]string, error) {
	ps, err := readPoints(filepath.Join(root, benchScale))
	if err != nil {
		return nil, err
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Dataplane < ps[j].Dataplane })
	out := []string{
		"| dataplane | Services x endpoints | first sync | partial sync, one weight | full resync, nothing changed | explain | list the ruleset | peak RSS | load | run |",
		"|---|---|---|---|---|---|---|---|---|---|",
	}
	for _, p := range ps {
		out = append(out, fmt.Sprintf("| %s | %s x %d | %s | %s | %s | %s | %s | %s | %s | %s |",
			p.Dataplane, count(p.Services), p.Endpoints, withCPU(p.First, p.FirstCPU), withCPU(p.Partial, p.PartialCPU),
			dur(p.Full), withCPU(p.Explain, p.ExplainCPU), dur(p.List), mib(p.RSSMiB), load(p.LoadAvg), run(p.Commit, p.Date)))
	}
	return append(out, "",
		fmt.Sprintf("Generated by `make docs` from %s (`make bench`, scripts/bench-scale.sh; the dataplane alone in a namespace, no API server): CPU seconds in brackets, load average at the end of the point's run.", link(root, dir, benchScale))), nil
}

// renderBenchObserved sets each dataplane's point with connection
// counting off beside the one with it on (scripts/bench-observed.sh) and
// the difference in percent.
func renderBenchObserved(root, dir, file string) ([]string, error) {
	ps, err := readPoints(filepath.Join(root, benchObserved))
	if err != nil {
		return nil, err
	}
	sort.SliceStable(ps, func(i, j int) bool { return ps[i].Dataplane < ps[j].Dataplane })
	out := []string{
		"| dataplane | Services x endpoints | counting | first sync | partial sync, one weight | one endpoint replaced | full resync, nothing changed | ruleset listed | read every count (a scrape) | load | run |",
		"|---|---|---|---|---|---|---|---|---|---|---|",
	}
	pct := func(on, off float64) string {
		if off <= 0 || on <= 0 {
			return "-"
		}
		return fmt.Sprintf("%+.0f%%", 100*(on-off)/off)
	}
	var off *point.Result
	for i := range ps {
		p := &ps[i]
		state := "off"
		if p.CountConnections {
			state = "on"
		}
		out = append(out, fmt.Sprintf("| %s | %s x %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
			p.Dataplane, count(p.Services), p.Endpoints, state, withCPU(p.First, p.FirstCPU), withCPU(p.Partial, p.PartialCPU),
			withCPU(p.Endpoint, p.EndpointCPU), dur(p.Full), mb(p.RulesetBytes), withCPU(p.Counts, p.CountsCPU), load(p.LoadAvg), run(p.Commit, p.Date)))
		if !p.CountConnections {
			off = p
			continue
		}
		if off != nil && off.Dataplane == p.Dataplane && off.Services == p.Services {
			out = append(out, fmt.Sprintf("| %s | | on against off, CPU-s | %s | %s | %s | %s | %s | | | |",
				p.Dataplane, pct(p.FirstCPU, off.FirstCPU), pct(p.PartialCPU, off.PartialCPU), pct(p.EndpointCPU, off.EndpointCPU),
				pct(p.FullCPU, off.FullCPU), pct(float64(p.RulesetBytes), float64(off.RulesetBytes))))
		}
	}
	return append(out, "",
		fmt.Sprintf("Generated by `make docs` from %s (scripts/bench-observed.sh: the scale benchmark with counting off, then on, in one run; each point alone in a namespace): CPU seconds in brackets (the differences compare CPU seconds, which the machine's load disturbs less than wall time; the ruleset's in bytes), load average at the end of the point's run.", link(root, dir, benchObserved))), nil
}

// mb prints a byte count in MB (10^6), "-" for none.
func mb(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MB", float64(n)/1e6)
}

func renderBenchNode(root, dir, file string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(root, benchNode))
	if err != nil {
		return nil, err
	}
	var r result.Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", benchNode, err)
	}
	if len(r.Runs) == 0 {
		return nil, fmt.Errorf("%s: no runs", benchNode)
	}
	head := fmt.Sprintf("Generated by `make docs` from %s (%s, %s): %s requests/s for %.0f s a run, %d CPUs; churn scales the backends 5 <-> 7.", link(root, dir, benchNode), run(r.Commit, ""), r.Date, count(r.Rate), r.Seconds, r.CPUs)
	if notes := result.Notes(&r); len(notes) > 0 {
		head += " " + strings.Join(notes, " ")
	}
	out := []string{
		head,
		"",
		"| upstreams | run | requests | errors | reloads | p50 | p99 | p99.9 | max | load (1 / 5 / 15 min) |",
		"|---|---|---|---|---|---|---|---|---|---|",
	}
	for _, x := range r.Runs {
		out = append(out, fmt.Sprintf("| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |",
			x.Upstreams, x.Phase, count(x.Requests), count(x.Errors), x.Reloads, ms(x.P50), ms(x.P99), ms(x.P999), ms(x.Max), load(x.LoadAvg)))
	}
	return out, nil
}

// proxyOrder puts steelyard's modes first and kube-proxy after them.
func proxyOrder(p string) string {
	if strings.HasPrefix(p, "steelyard") {
		return "0" + p
	}
	return "1" + p
}

func renderConformance(root, dir, file string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(root, conformanceGl))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		where := "; " + link(root, dir, "docs/conformance.md") + " has the method and what earlier runs found"
		if filepath.Base(file) == "conformance.md" {
			where = ""
		}
		return []string{"No committed run exists: there is no summary under docs/conformance/ yet, so no table here. `make conformance` writes one per proxy and `make docs` renders it" + where + "."}, nil
	}
	var sums []summary.Summary
	for _, f := range files {
		s, err := summary.Read(f)
		if err != nil {
			return nil, err
		}
		sums = append(sums, s)
	}
	sort.Slice(sums, func(i, j int) bool { return proxyOrder(sums[i].Proxy) < proxyOrder(sums[j].Proxy) })
	out := []string{
		"| proxy | passed | failed | skipped by the test | filtered by skip.txt | not run | wall time | nodes | run | load |",
		"|---|---|---|---|---|---|---|---|---|---|",
	}
	refPassed := map[string]bool{}
	haveRef := false
	for _, s := range sums {
		// The reference: kube-proxy in either mode (kube-proxy is
		// iptables, kube-proxy-nftables nftables).
		if strings.HasPrefix(s.Proxy, "kube-proxy") {
			haveRef = true
			for _, sp := range s.Specs {
				if sp.Result == summary.Passed {
					refPassed[sp.Name] = true
				}
			}
		}
	}
	var worse []string
	for _, s := range sums {
		n := s.Counts()
		for _, sp := range s.Specs {
			if sp.Result == summary.Failed && strings.HasPrefix(s.Proxy, "steelyard") && refPassed[sp.Name] {
				worse = append(worse, s.Proxy+": "+sp.Name)
			}
		}
		name := s.Proxy
		if s.Focus != "" {
			name += fmt.Sprintf(" (--focus %q)", s.Focus)
		}
		out = append(out, fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %s | %s | %s | %s |",
			name, n[summary.Passed], n[summary.Failed], n[summary.SkippedRun], n[summary.SkipListed], n[summary.NotRun]+n[summary.Incomplete],
			dur(s.WallSeconds), fmt.Sprint(s.Nodes)+dualStack(s), run(s.Commit, s.Date), load(s.LoadAvg)))
	}
	if filepath.Base(file) != "conformance.md" {
		// The README keeps one line (it stays under 200): the counts per
		// proxy, the table and the reasons are on docs/conformance.md.
		// One run named in the header when every proxy's is the same,
		// else each proxy's after its counts: the summaries are written
		// per proxy and may come from different runs.
		oneRun := true
		for _, s := range sums {
			oneRun = oneRun && run(s.Commit, s.Date) == run(sums[0].Commit, sums[0].Date)
		}
		var parts []string
		for _, s := range sums {
			n := s.Counts()
			part := fmt.Sprintf("%s %d / %d / %d / %d", s.Proxy, n[summary.Passed], n[summary.Failed], n[summary.SkippedRun], n[summary.NotRun]+n[summary.Incomplete])
			if !oneRun {
				part += " (" + run(s.Commit, s.Date) + ")"
			}
			parts = append(parts, part)
		}
		header := ""
		if oneRun {
			header = ", " + run(sums[0].Commit, sums[0].Date)
		}
		line := fmt.Sprintf("Passed / failed / skipped by the test / not run, %d nodes%s%s: %s.", sums[0].Nodes, dualStack(sums[0]), header, strings.Join(parts, "; "))
		if haveRef {
			line += fmt.Sprintf(" Failed for steelyard and passed for kube-proxy: %d.", len(worse))
		}
		return []string{line + " Table, load and reasons: " + link(root, dir, "docs/conformance.md") + "."}, nil
	}
	out = append(out, "")
	if haveRef {
		if len(worse) == 0 {
			out = append(out, "Failed for steelyard and passed for kube-proxy: none.")
		} else {
			out = append(out, fmt.Sprintf("Failed for steelyard and passed for kube-proxy: %d.", len(worse)))
			for _, w := range worse {
				out = append(out, "- "+w)
			}
		}
		out = append(out, "")
	}
	return append(out, fmt.Sprintf("Generated by `make docs` from %s (`make conformance`, one file per proxy, every selected spec with its result).",
		"docs/conformance/*.json")), nil
}

// dualStack is ", dual-stack" when a conformance run's cluster ran both
// IP families (the [Feature:IPv6DualStack] specs ran), else "".
func dualStack(s summary.Summary) string {
	if s.DualStack {
		return ", dual-stack"
	}
	return ""
}
