package result

import "testing"

func TestLifecycleWindows(t *testing.T) {
	run := Run{Phase: "churn", Scales: []Event{{T: 10, Replicas: 7}, {T: 20, Replicas: 5}}}
	for ts := 0.0; ts < 30; ts += 0.5 {
		p := Point{T: ts, P99: 1, Max: 2, CPU: 50}
		if ts == 25 { // 5 s after the scale-down: the pods' teardown
			p.Max, p.P99 = 300, 200
		}
		run.Series = append(run.Series, p)
	}
	got := map[Window]WindowStats{}
	n := 0
	for _, s := range Lifecycle(run, 0.5, 5) {
		got[s.Window] = s
		n += s.Buckets
	}
	if n != len(run.Series) {
		t.Fatalf("%d buckets grouped, want %d", n, len(run.Series))
	}
	want := map[Window]int{WindowBefore: 20, WindowUp: 3, WindowDown: 3, WindowTeardown: 5}
	for w, b := range want {
		if got[w].Buckets != b {
			t.Errorf("%s: %d buckets, want %d", w, got[w].Buckets, b)
		}
	}
	if s := got[WindowTeardown]; s.Slow != 1 || s.WorstMS != 300 {
		t.Errorf("teardown window: %+v, want the one slow bucket", s)
	}
	if s := got[WindowRest]; s.Slow != 0 || s.WorstMS != 2 {
		t.Errorf("rest: %+v", s)
	}
}
