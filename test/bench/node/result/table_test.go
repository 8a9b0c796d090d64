package result

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// A report with a frozen run says what the run was, how many of its
// backends it kept and that the liveness probe was off, in the JSON and
// in the printed table.
func TestFrozenRunReported(t *testing.T) {
	rep := &Report{Date: "2026-12-07T07:00:00Z", CPUs: 2, Rate: 2000, Seconds: 120, NoLivenessProbe: true, Runs: []Run{
		{Upstreams: "vip", Phase: "churn", P999: 66},
		{Upstreams: "vip", Phase: "frozen", FrozenKept: 5, P999: 40},
	}}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.NoLivenessProbe || back.Runs[1].Phase != "frozen" || back.Runs[1].FrozenKept != 5 || back.Runs[0].FrozenKept != 0 {
		t.Errorf("round trip lost the frozen run: %+v", back)
	}
	if n := strings.Count(string(b), "frozen_kept"); n != 1 {
		t.Errorf("the churn run carries frozen_kept: %s", b)
	}
	var out bytes.Buffer
	Table(&out, rep)
	if !regexp.MustCompile(`(?m)^vip +frozen +0 `).MatchString(out.String()) {
		t.Errorf("table has no vip frozen row:\n%s", out.String())
	}
	for _, want := range []string{
		"vip frozen: the churn with steelyard's agent stopped (SIGSTOP) once its rules held the 5 backends, nginx serving; 5 of the 5 still ran at the end.",
		"Every run without the DaemonSet's liveness probe",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// A report of steady and churn runs only needs no note.
func TestNotesNone(t *testing.T) {
	if n := Notes(&Report{Runs: []Run{{Upstreams: "vip", Phase: "steady"}, {Upstreams: "pods", Phase: "churn"}}}); len(n) != 0 {
		t.Errorf("notes %q for steady and churn", n)
	}
}
