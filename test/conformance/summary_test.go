package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// fixtureRules select [sig-network] and remove load balancers, as
// skip.txt does (line 3).
const fixtureRules = "# rules\nfocus \\[sig-network\\] # the network SIG\nskip \\[Feature:LoadBalancer\\] # no cloud load balancer\n"

func fixture(t *testing.T, proxy string) (result, List) {
	t.Helper()
	l, err := ParseList(strings.NewReader(fixtureRules))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("testdata/junit-small.xml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o, err := ParseJUnit(f)
	if err != nil {
		t.Fatal(err)
	}
	o.Classify(l)
	return result{Outcome: o, proxy: proxy, wall: 10*time.Minute + 41*time.Second}, l
}

// The summary lists every selected spec with its result: the spec a skip
// rule removed apart from the one that skipped itself, the one never
// started as not run; the spec out of focus is only counted.
func TestSummary(t *testing.T) {
	r, l := fixture(t, "steelyard-iptables")
	if r.OutOfFocus != 1 || r.NotRun != 1 || len(r.SkipListed) != 1 || len(r.Skipped) != 1 {
		t.Fatalf("classified: out of focus %d, not run %d, skip-listed %q, skipped %q", r.OutOfFocus, r.NotRun, r.SkipListed, r.Skipped)
	}
	s := summarize(r, l, Summary{Commit: "c91b402", Date: "2026-12-04T19:00:00Z", Nodes: 1})
	want := map[string][2]string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":    {Passed, ""},
		"[sig-network] Services should serve multiport endpoints from pods [Conformance]": {Passed, ""},
		"[sig-network] Services should be rejected when no endpoints exist [Conformance]": {Failed, "connection timed out, want refused"},
		"[sig-network] Services should work across nodes":                                 {SkippedRun, "Requires at least 2 nodes (not 1)"},
		"[sig-network] LoadBalancers should be reachable [Feature:LoadBalancer]":          {SkipListed, "skip.txt:3: no cloud load balancer"},
		"[sig-network] Services should be updated after adding or deleting ports":         {NotRun, ""},
	}
	if len(s.Specs) != len(want) {
		t.Errorf("%d specs, want %d: %+v", len(s.Specs), len(want), s.Specs)
	}
	for _, sp := range s.Specs {
		if w, ok := want[sp.Name]; !ok || w != [2]string{sp.Result, sp.Reason} {
			t.Errorf("spec %q: %s %q, want %q", sp.Name, sp.Result, sp.Reason, w)
		}
	}
	if s.Proxy != "steelyard-iptables" || s.WallSeconds != 641 || s.OutOfFocus != 1 || s.Commit != "c91b402" {
		t.Errorf("summary %+v", s)
	}

	// Written one spec a line, and read back the same.
	p, err := writeSummary(t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var back Summary
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if back.Proxy != s.Proxy || len(back.Specs) != len(s.Specs) || back.Specs[0] != s.Specs[0] {
		t.Errorf("read back %+v", back)
	}
	// One "specs" key: a strict reader (jq's --seq, Python's
	// object_pairs_hook) sees no duplicate.
	if n := strings.Count(string(b), `"specs"`); n != 1 {
		t.Errorf("%d \"specs\" keys, want 1:\n%s", n, b)
	}
	if n := strings.Count(string(b), "\n  {\"name\""); n != len(s.Specs) {
		t.Errorf("%d spec lines, want %d:\n%s", n, len(s.Specs), b)
	}
}

// The run fails when a selected spec fails or never runs for a steelyard
// proxy, never for kube-proxy's failures alone; a harness error fails it
// for any proxy.
func TestVerdict(t *testing.T) {
	bad, _ := fixture(t, "steelyard-nftables")
	ref, _ := fixture(t, "kube-proxy")
	clean := result{proxy: "steelyard-iptables", Outcome: Outcome{Passed: []string{"a"}}}
	notRun := result{proxy: "steelyard-iptables", Outcome: Outcome{Passed: []string{"a"}, NotRun: 1}}
	for _, c := range []struct {
		name string
		in   []result
		fail bool
	}{
		{"steelyard failed a spec", []result{clean, bad, ref}, true},
		{"only kube-proxy failed", []result{clean, ref}, false},
		{"steelyard left a spec not run", []result{notRun}, true},
		{"all passed", []result{clean}, false},
		{"kube-proxy's harness failed", []result{clean, {proxy: "kube-proxy", err: os.ErrNotExist}}, true},
	} {
		why := verdict(c.in)
		if (why != "") != c.fail {
			t.Errorf("%s: verdict %q, want failing %v", c.name, why, c.fail)
		}
	}
	if why := verdict([]result{bad}); !strings.Contains(why, "steelyard-nftables: 1 failed, 0 interrupted, 1 not run") {
		t.Errorf("verdict %q", why)
	}
}

// The table's comparison takes kube-proxy in either mode as the
// reference: a spec steelyard failed that only kube-proxy's nftables mode
// passed is listed, and the kube-proxy runs are not compared themselves.
func TestRenderReference(t *testing.T) {
	const spec = "[sig-network] Services should be rejected when no endpoints exist [Conformance]"
	bad, l := fixture(t, "steelyard-nftables")
	kpIptables := result{proxy: "kube-proxy", Outcome: Outcome{Failed: []string{spec}}}
	kpNft := result{proxy: "kube-proxy-nftables", Outcome: Outcome{Passed: []string{spec}}}
	got := render([]result{bad, kpIptables, kpNft}, l, "/nonexistent", "/nonexistent", 3)
	for _, want := range []string{
		"3 node(s)",
		"failed for steelyard-nftables, passed for kube-proxy (either mode): 1\n  " + spec,
		"| kube-proxy-nftables | 1 | 0 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "failed for kube-proxy") {
		t.Errorf("a reference compared with itself:\n%s", got)
	}
	if got := render([]result{bad, kpIptables}, l, "/nonexistent", "/nonexistent", 3); !strings.Contains(got, "passed for kube-proxy (either mode): 0") {
		t.Errorf("kube-proxy failed the spec too; want none listed:\n%s", got)
	}
}
