package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"sort"
	"strings"
)

// junitSuites is the part of ginkgo's JUnit report the runner reads.
type junitSuites struct {
	Time   float64 `xml:"time,attr"`
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// Outcome is one proxy's run, from its JUnit report.
type Outcome struct {
	// Passed and Failed hold spec names (ginkgo's full text).
	Passed, Failed []string
	// Skipped are specs the run selected that skipped themselves (an
	// e2eskipper check such as "requires at least 2 nodes"), name -> why.
	Skipped map[string]string
	// SkipListed are the specs the focus rules select and a skip rule of
	// skip.txt removes, name -> "skip.txt:LINE: reason" (see Classify).
	SkipListed map[string]string
	// OutOfFocus counts the specs no focus rule selects (most of e2e.test).
	OutOfFocus int
	// Interrupted are specs cut short by an interrupt or ginkgo's
	// --timeout; NotRun counts the selected specs that never started then.
	Interrupted []string
	NotRun      int
	// Unstarted are the specs reported as bare "skipped": filtered out, or
	// selected but never started (an interrupted run); see Classify.
	Unstarted []string
	// Seconds is the suite's duration as ginkgo reports it.
	Seconds float64
	// Messages are the failure messages, by name.
	Messages map[string]string
}

// ParseJUnit reads a ginkgo v2 JUnit report. Ginkgo reports specs that
// the focus and skip flags filtered out as skipped with the bare message
// "skipped", and specs that called Skip with "skipped - <why>".
func ParseJUnit(r io.Reader) (Outcome, error) {
	var s junitSuites
	if err := xml.NewDecoder(r).Decode(&s); err != nil {
		return Outcome{}, fmt.Errorf("junit: %w", err)
	}
	o := Outcome{Skipped: map[string]string{}, SkipListed: map[string]string{}, Messages: map[string]string{}}
	for _, suite := range s.Suites {
		for _, c := range suite.Cases {
			name := specName(c.Name)
			switch {
			case c.Status == "interrupted" || c.Status == "aborted":
				o.Interrupted = append(o.Interrupted, name)
			case c.Failure != nil || c.Error != nil || c.Status == "failed" || c.Status == "panicked" || c.Status == "timedout":
				// Suite-level nodes ([SynchronizedBeforeSuite] and the
				// like) count as failures too: they fail the run.
				o.Failed = append(o.Failed, name)
				msg := ""
				if c.Failure != nil {
					msg = c.Failure.Message
				} else if c.Error != nil {
					msg = c.Error.Message
				}
				o.Messages[name] = msg
			case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
				msg := ""
				if c.Skipped != nil {
					msg = c.Skipped.Message
				}
				if why, ok := strings.CutPrefix(msg, "skipped - "); ok && strings.Contains(why, "nterrupt") {
					o.NotRun++
				} else if ok {
					o.Skipped[name] = why
				} else {
					o.Unstarted = append(o.Unstarted, name)
				}
			case c.Status == "passed" || c.Status == "":
				if strings.HasPrefix(c.Name, "[It]") || !strings.HasPrefix(c.Name, "[") {
					o.Passed = append(o.Passed, name)
				}
			}
		}
	}
	o.Seconds = s.Time
	sort.Strings(o.Passed)
	sort.Strings(o.Failed)
	return o, nil
}

// Classify sorts the specs the report shows as bare "skipped" by the
// rules: those a skip rule of skip.txt removes (SkipListed, with the
// rule), those no focus rule selects (OutOfFocus), and those the rules
// select that never started, as in an interrupted run (NotRun). Ginkgo
// reports all three the same way. Call it once per Outcome.
func (o *Outcome) Classify(l List) {
	if o.SkipListed == nil {
		o.SkipListed = map[string]string{}
	}
	for _, n := range o.Unstarted {
		switch run, by := l.Selected(n); {
		case run:
			o.NotRun++
		case by != nil:
			o.SkipListed[n] = fmt.Sprintf("skip.txt:%d: %s", by.Line, by.Reason)
		default:
			o.OutOfFocus++
		}
	}
}

// specName strips ginkgo's "[It] " (node type) prefix from a test case's
// name, leaving the spec's full text (and its labels, if any).
func specName(n string) string {
	for _, p := range []string{"[It] ", "[SynchronizedBeforeSuite] ", "[BeforeSuite] ", "[SynchronizedAfterSuite] ", "[AfterSuite] ", "[DeferCleanup (Suite)] ", "[ReportAfterSuite] ", "[ReportBeforeSuite] "} {
		if rest, ok := strings.CutPrefix(n, p); ok {
			if p == "[It] " {
				return rest
			}
			return n
		}
	}
	return n
}
