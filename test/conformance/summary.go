package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Summary is one proxy's run as committed under docs/conformance/
// (<proxy>.json): every spec the focus rules select, with its result,
// and the run it came from. test/docsgen renders the README's and
// docs/conformance.md's tables from these files, so each figure there
// counts lines of a committed file.
type Summary struct {
	Proxy string `json:"proxy"`
	// Commit is the commit the runner (and, built by the same `make
	// conformance`, the steelyard image) came from; Date when the run
	// ended (RFC 3339, UTC); LoadAvg the load average then.
	Commit  string `json:"commit"`
	Date    string `json:"date"`
	LoadAvg string `json:"loadavg"`
	// E2E and Ginkgo are the versions that ran; Nodes the number of
	// Kubernetes nodes, Processes ginkgo's parallelism.
	E2E       string `json:"e2e"`
	Ginkgo    string `json:"ginkgo"`
	Nodes     int    `json:"nodes"`
	Processes int    `json:"processes"`
	// WallSeconds is the suite's wall time; Focus is the --focus that
	// replaced skip.txt's focus lines ("" for a full run).
	WallSeconds float64 `json:"wall_s"`
	Focus       string  `json:"focus,omitempty"`
	// OutOfFocus counts the specs of e2e.test no focus rule selects
	// (not listed).
	OutOfFocus int `json:"out_of_focus"`
	// Specs are sorted by name.
	Specs []Spec `json:"specs"`
}

// Spec results in a Summary.
const (
	Passed     = "passed"
	Failed     = "failed"
	SkippedRun = "skipped"    // the spec skipped itself (e2eskipper), Reason says why
	SkipListed = "skip.txt"   // a skip rule removed it, Reason names the rule
	NotRun     = "not run"    // selected, never finished (interrupted, time-boxed)
	Incomplete = "incomplete" // interrupted while it ran
)

// Spec is one spec's result.
type Spec struct {
	Name   string `json:"name"`
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
}

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

// writeSummary writes s as dir/<proxy>.json: the run's fields, then one
// spec a line, so a rerun's diff shows which specs changed.
func writeSummary(dir string, s Summary) (string, error) {
	specs := s.Specs
	s.Specs = nil
	head, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	b.Write(bytes.TrimSuffix(head, []byte("\n}")))
	b.WriteString(",\n \"specs\": [")
	for i, sp := range specs {
		line, err := json.Marshal(sp)
		if err != nil {
			return "", err
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("\n  ")
		b.Write(line)
	}
	b.WriteString("\n ]\n}\n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	p := filepath.Join(dir, s.Proxy+".json")
	return p, os.WriteFile(p, b.Bytes(), 0o644)
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
