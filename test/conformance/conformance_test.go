package main

import (
	"os"
	"strings"
	"testing"
)

func TestParseListNeedsReasons(t *testing.T) {
	for _, in := range []string{
		"focus \\[sig-network\\]\n",          // no reason
		"focus a # why\nskip b\n",            // skip without reason
		"focus a # why\nskip b #\n",          // empty reason
		"focus a # why\nignore b # why\n",    // unknown kind
		"skip b # why\n",                     // no focus
		"focus a # why\nskip ( # bad regexp", // bad regexp
	} {
		if _, err := ParseList(strings.NewReader(in)); err == nil {
			t.Errorf("ParseList(%q): no error", in)
		}
	}
}

func TestListSelected(t *testing.T) {
	l, err := ParseList(strings.NewReader("# c\nfocus \\[sig-network\\] Services # the Services\nskip LoadBalancer # no cloud\n"))
	if err != nil {
		t.Fatal(err)
	}
	for text, want := range map[string]string{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                       "run",
		"[sig-network] Services should be able to create an internal type load balancer [Slow] LoadBalancer": "skip",
		"[sig-storage] Volumes should work": "out",
	} {
		run, by := l.Selected(text)
		got := "out"
		if run {
			got = "run"
		} else if by != nil {
			got = "skip"
			if by.Reason != "no cloud" {
				t.Errorf("%q: skipped by %q", text, by.Reason)
			}
		}
		if got != want {
			t.Errorf("%q: %s, want %s", text, got, want)
		}
	}
	if got := strings.Join(l.GinkgoArgs(), " "); got != "--focus=\\[sig-network\\] Services --skip=LoadBalancer" {
		t.Errorf("GinkgoArgs: %s", got)
	}
}

// The committed skip.txt parses: every rule has a reason.
func TestSkipFile(t *testing.T) {
	f, err := os.Open("skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ParseList(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Skip) == 0 {
		t.Error("no skip rules")
	}
}

// A report in ginkgo v2's JUnit shape: a pass, a failure, a runtime skip,
// a spec the filters left out, and a suite node.
const sampleJUnit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="1" errors="0" failures="1" time="12.5">
  <testsuite name="Kubernetes e2e suite" package="/e2e" tests="4" disabled="1" skipped="2" errors="0" failures="1" time="12.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.0"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3.1"></testcase>
    <testcase name="[It] [sig-network] Services should be rejected when no endpoints exist [Conformance]" classname="Kubernetes e2e suite" status="failed" time="5.2">
      <failure message="connection timed out, want refused" type="failed">stack</failure>
    </testcase>
    <testcase name="[It] [sig-network] Services should work across nodes" classname="Kubernetes e2e suite" status="skipped" time="0.1">
      <skipped message="skipped - Requires at least 2 nodes (not 1)"></skipped>
    </testcase>
    <testcase name="[It] [sig-storage] Volumes should work" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	o, err := ParseJUnit(strings.NewReader(sampleJUnit))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Passed) != 1 || o.Passed[0] != "[sig-network] Services should serve a basic endpoint from pods [Conformance]" {
		t.Errorf("passed: %q", o.Passed)
	}
	if len(o.Failed) != 1 || o.Messages[o.Failed[0]] != "connection timed out, want refused" {
		t.Errorf("failed: %q %q", o.Failed, o.Messages)
	}
	if why := o.Skipped["[sig-network] Services should work across nodes"]; len(o.Skipped) != 1 || why != "Requires at least 2 nodes (not 1)" {
		t.Errorf("skipped: %q", o.Skipped)
	}
	if len(o.Unstarted) != 1 {
		t.Errorf("unstarted: %q, want 1", o.Unstarted)
	}
}

// The dual-stack specs run on a cluster of several nodes (dual-stack),
// and are skipped with a reason on one node (single-stack), where they
// would otherwise fail for every proxy.
func TestFamilyRules(t *testing.T) {
	f, err := os.Open("skip.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ParseList(f)
	if err != nil {
		t.Fatal(err)
	}
	const spec = "[sig-network] [Feature:IPv6DualStack] should create service with ipv6 cluster ip"
	if run, by := familyRules(l, dualStack(3)).Selected(spec); !run {
		t.Errorf("3 nodes: %q not run (rule %+v)", spec, by)
	}
	run, by := familyRules(l, dualStack(1)).Selected(spec)
	if run || by == nil || !strings.Contains(by.Reason, "single-stack") {
		t.Errorf("1 node: %q run %t, rule %+v; want skipped as single-stack", spec, run, by)
	}
	if n := len(l.Skip); len(familyRules(l, false).Skip) != n+1 || len(l.Skip) != n {
		t.Errorf("familyRules changed the list it was given")
	}
	const internet = "[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv6] [Experimental][LinuxOnly]"
	if run, _ := familyRules(l, true).Selected(internet); run {
		t.Errorf("%q runs on a box without Internet", internet)
	}
}
