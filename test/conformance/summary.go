package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/steelyard-net/steelyard/test/conformance/summary"
)

// Summary and Spec are the committed form of a run (package summary).
type (
	Summary = summary.Summary
	Spec    = summary.Spec
)

// The results a Spec can have.
const (
	Passed     = summary.Passed
	Failed     = summary.Failed
	SkippedRun = summary.SkippedRun
	SkipListed = summary.SkipListed
	NotRun     = summary.NotRun
	Incomplete = summary.Incomplete
)

// writeSummary writes s as dir/<proxy>.json (summary.Write).
func writeSummary(dir string, s Summary) (string, error) { return summary.Write(dir, s) }

// summarize turns one proxy's Outcome into its Summary. Not-run specs
// have no names in the report beyond those in Unstarted, so they are
// listed from there.
func summarize(r result, rules List, run Summary) Summary {
	s := run
	s.Proxy = r.proxy
	s.WallSeconds = r.wall.Round(time.Second).Seconds()
	s.OutOfFocus = r.OutOfFocus
	add := func(name, res, why string) { s.Specs = append(s.Specs, Spec{Name: name, Result: res, Reason: why}) }
	for _, n := range r.Passed {
		add(n, Passed, "")
	}
	for _, n := range r.Failed {
		add(n, Failed, firstLine(r.Messages[n]))
	}
	for n, why := range r.Skipped {
		add(n, SkippedRun, why)
	}
	for n, why := range r.SkipListed {
		add(n, SkipListed, why)
	}
	for _, n := range r.Interrupted {
		add(n, Incomplete, "")
	}
	for _, n := range r.Unstarted {
		if ok, _ := rules.Selected(n); ok {
			add(n, NotRun, "")
		}
	}
	sort.Slice(s.Specs, func(i, j int) bool {
		if s.Specs[i].Name != s.Specs[j].Name {
			return s.Specs[i].Name < s.Specs[j].Name
		}
		return s.Specs[i].Result < s.Specs[j].Result
	})
	return s
}

// isSteelyard reports whether proxy is one of steelyard's modes (the
// proxies under test; kube-proxy is the reference).
func isSteelyard(proxy string) bool { return strings.HasPrefix(proxy, "steelyard-") }

// verdict is why the run fails, or "" when it passes: a proxy whose run
// did not complete (the harness failed), or a steelyard proxy with a
// selected spec that failed, was interrupted or never ran. kube-proxy's
// failures are reported in the table and do not fail the run: it is the
// reference, and a spec it fails says something about the harness or the
// spec, not steelyard.
func verdict(results []result) string {
	var why []string
	for _, r := range results {
		switch {
		case r.err != nil:
			why = append(why, fmt.Sprintf("%s did not complete: %v", r.proxy, r.err))
		case !isSteelyard(r.proxy):
		case len(r.Failed) > 0 || len(r.Interrupted) > 0 || r.NotRun > 0:
			why = append(why, fmt.Sprintf("%s: %d failed, %d interrupted, %d not run", r.proxy, len(r.Failed), len(r.Interrupted), r.NotRun))
		}
	}
	return strings.Join(why, "; ")
}
