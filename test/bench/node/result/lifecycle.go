package result

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// Window names a part of a churn run by where its pods are in their life.
type Window string

// The windows of a churn run: the seconds right after a scale-up (pods
// created: sandboxes, CNI ADD, containers start), right after a scale-down
// (endpoints leave the rules; the pods still run their preStop pause), when
// the preStop pause ends (processes killed, CNI DEL, network namespaces
// deleted), and the rest.
const (
	WindowBefore   Window = "before the first scale"
	WindowUp       Window = "scale-up +0-1.5 s (pods created)"
	WindowDown     Window = "scale-down +0-1.5 s (endpoints leave)"
	WindowTeardown Window = "scale-down +preStop-0.5..+2 s (pods torn down)"
	WindowRest     Window = "the rest"
)

// WindowStats is a churn run's latency in one Window, over the series'
// buckets that fall in it.
type WindowStats struct {
	Window  Window
	Buckets int
	// Slow is the number of buckets whose worst request took 50 ms or more.
	Slow int
	// WorstMS is the largest request latency; MeanP99MS the mean of the
	// buckets' p99; MeanCPU the machine's mean CPU use (%).
	WorstMS, MeanP99MS, MeanCPU float64
}

// Lifecycle groups run's series by Window; preStop is the pods' preStop
// pause in seconds. Why: the slow-request counts "after an event" cannot
// tell a kernel rule write from a pod starting on the same node a moment
// earlier; the pods' lifecycle can.
func Lifecycle(run Run, bucket, preStop float64) []WindowStats {
	scales := append([]Event(nil), run.Scales...)
	sort.Slice(scales, func(i, j int) bool { return scales[i].T < scales[j].T })
	by := map[Window]*WindowStats{}
	order := []Window{WindowBefore, WindowUp, WindowDown, WindowTeardown, WindowRest}
	for _, w := range order {
		by[w] = &WindowStats{Window: w}
	}
	for _, p := range run.Series {
		mid := p.T + bucket/2
		w := WindowRest
		var last *Event
		for i := range scales {
			if scales[i].T <= mid {
				last = &scales[i]
			}
		}
		switch {
		case last == nil:
			w = WindowBefore
		case mid-last.T < 1.5 && last.Replicas > replicasBefore(scales, last):
			w = WindowUp
		case mid-last.T < 1.5:
			w = WindowDown
		case last.Replicas < replicasBefore(scales, last) && mid-last.T >= preStop-0.5 && mid-last.T < preStop+2:
			w = WindowTeardown
		}
		s := by[w]
		s.Buckets++
		if p.Max >= 50 {
			s.Slow++
		}
		s.WorstMS = max(s.WorstMS, p.Max)
		s.MeanP99MS += p.P99
		s.MeanCPU += p.CPU
	}
	var out []WindowStats
	for _, w := range order {
		s := by[w]
		if s.Buckets == 0 {
			continue
		}
		s.MeanP99MS /= float64(s.Buckets)
		s.MeanCPU /= float64(s.Buckets)
		out = append(out, *s)
	}
	return out
}

// replicasBefore is the replica count asked for before e (5 before the
// first event: the steady size).
func replicasBefore(scales []Event, e *Event) int {
	prev := 5
	for i := range scales {
		if &scales[i] == e {
			return prev
		}
		prev = scales[i].Replicas
	}
	return prev
}

// LifecycleTable prints Lifecycle for every churn run of r.
func LifecycleTable(w io.Writer, r *Report) {
	if r.PreStopSeconds == 0 {
		return
	}
	fmt.Fprintf(w, "\nchurn and bystander runs by where the pods are in their life (%.1f-s buckets; preStop %.0f s):\n", r.Bucket, r.PreStopSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "upstreams\trun\twindow\tbuckets\tworst >= 50 ms\tworst\tmean p99\tmean CPU")
	for _, run := range r.Runs {
		if run.Phase == "steady" {
			continue
		}
		for _, s := range Lifecycle(run, r.Bucket, r.PreStopSeconds) {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d (%.0f%%)\t%.0f ms\t%.1f ms\t%.0f%%\n", run.Upstreams, run.Phase, s.Window, s.Buckets, s.Slow, 100*float64(s.Slow)/float64(s.Buckets), s.WorstMS, s.MeanP99MS, s.MeanCPU)
		}
	}
	tw.Flush()
}
