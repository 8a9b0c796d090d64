// Package summary is one proxy's run of `make conformance` as committed
// under docs/conformance/<proxy>.json: test/conformance writes it and
// test/docsgen renders the README's and docs/conformance.md's tables
// from it, so the two agree on one type.
package summary

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	// Kubernetes nodes, DualStack whether the cluster ran both IP
	// families, Processes ginkgo's parallelism.
	E2E       string `json:"e2e"`
	Ginkgo    string `json:"ginkgo"`
	Nodes     int    `json:"nodes"`
	DualStack bool   `json:"dual_stack"`
	Processes int    `json:"processes"`
	// WallSeconds is the suite's wall time; Focus is the --focus that
	// replaced skip.txt's focus lines ("" for a full run).
	WallSeconds float64 `json:"wall_s"`
	Focus       string  `json:"focus,omitempty"`
	// OutOfFocus counts the specs of e2e.test no focus rule selects
	// (not listed).
	OutOfFocus int `json:"out_of_focus"`
	// Specs are sorted by name.
	// omitempty: Write marshals the run's fields without them, then the
	// specs one a line (no second "specs": null key).
	Specs []Spec `json:"specs,omitempty"`
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

// Write writes s as dir/<proxy>.json: the run's fields, then one
// spec a line, so a rerun's diff shows which specs changed.
func Write(dir string, s Summary) (string, error) {
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

// Counts are the number of specs per result.
func (s Summary) Counts() map[string]int {
	n := map[string]int{}
	for _, sp := range s.Specs {
		n[sp.Result]++
	}
	return n
}

// Read reads a summary Write wrote; one without a proxy is an error.
func Read(path string) (Summary, error) {
	var s Summary
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	if s.Proxy == "" {
		return s, fmt.Errorf("%s: no proxy", path)
	}
	return s, nil
}
