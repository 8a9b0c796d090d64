package result

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Table prints the four runs, the rate and how it was chosen.
func Table(w io.Writer, r *Report) {
	fmt.Fprintf(w, "\n%s, %d CPUs: %d requests/s through nginx for %.0f s per run, churn: scale 5 <-> 7 every 10-12 s\n", r.Date, r.CPUs, r.Rate, r.Seconds)
	if len(r.Probe) > 0 {
		var s []string
		for _, p := range r.Probe {
			verdict := "ok"
			if !p.OK {
				verdict = "saturated"
			}
			s = append(s, fmt.Sprintf("%d/s p99 %.1f ms %d errors sender %.0f ms behind (%s)", p.Rate, p.P99, p.Errors, p.Behind, verdict))
		}
		fmt.Fprintf(w, "rate probe (10 s each, VIP upstreams, steady): %s\n", strings.Join(s, "; "))
	}
	for _, n := range Notes(r) {
		fmt.Fprintln(w, n)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "upstreams\trun\trequests\terrors\treloads\tp50\tp99\tp99.9\tmax\tkernel syncs (mean)\t>=50ms (after scale/slice/sync/reload; CPU>=90%)\tCPU\tload avg")
	for _, x := range r.Runs {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.2f ms\t%.2f ms\t%.2f ms\t%.1f ms\t%d (%.0f ms)\t%d (%d/%d/%d/%d; %d)\t%.0f%%\t%s\n", x.Upstreams, x.Phase, x.Requests, x.Errors, x.Reloads,
			x.P50, x.P99, x.P999, x.Max, x.Syncs, x.SyncMeanMS, x.Slow, x.SlowNearScale, x.SlowNearSlice, x.SlowNearSync, x.SlowNearReload, x.SlowBusy, x.CPUBusy, x.LoadAvg)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nCPU seconds used during each run, by whom (the machine has", r.CPUs, "CPUs):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "upstreams\trun\tmachine\tnode cgroup\t(steelyard pod: agent+nginx)\tload generator\tcontrol plane\tother work on the machine")
	for _, x := range r.Runs {
		c := x.CPUSeconds
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t(%.0f)\t%.0f\t%.0f\t%.0f (%.0f%%)\n", x.Upstreams, x.Phase, c.Machine, c.Node, c.Steelyard, c.LoadGen, c.ControlPlane, c.Other, 100*c.Other/max(c.Machine, 1))
	}
	tw.Flush()
	fmt.Fprintln(w, "\nwhere the slow requests were due: share of the slow requests within 1 s after each kind of event,")
	fmt.Fprintln(w, "against the share of the run those windows cover (equal shares: the events do not explain the tail):")
	for _, x := range r.Runs {
		if x.Slow == 0 {
			continue
		}
		scales := make([]float64, len(x.Scales))
		for i, e := range x.Scales {
			scales[i] = e.T
		}
		pc := func(n int) float64 { return 100 * float64(n) / float64(x.Slow) }
		fmt.Fprintf(w, "  %s %s: %d slow; after a scale %.0f%% (windows %.0f%%), slice change %.0f%% (%.0f%%), kernel sync %.0f%% (%.0f%%), reload %.0f%% (%.0f%%); CPU >= 90%% in their bucket %.0f%%\n",
			x.Upstreams, x.Phase, x.Slow, pc(x.SlowNearScale), Coverage(scales, r.Seconds), pc(x.SlowNearSlice), Coverage(x.SliceChanges, r.Seconds),
			pc(x.SlowNearSync), Coverage(x.SyncTimes, r.Seconds), pc(x.SlowNearReload), Coverage(x.ReloadTimes, r.Seconds), pc(x.SlowBusy))
	}
	LifecycleTable(w, r)
	fmt.Fprintln(w, "\nerrors by class, and nginx's upstream errors (its error log) by cause:")
	for _, x := range r.Runs {
		fmt.Fprintf(w, "  %s %s: %v; nginx %v\n", x.Upstreams, x.Phase, x.ErrClasses, x.NginxErrors)
	}
	fmt.Fprintln(w, "\nlatency from each request's due time (open loop); errors include timeouts; a slow request counts")
	fmt.Fprintln(w, "near an event when due within 1 s after it; CPU is the whole machine's (other work shares it).")
}

// Coverage is the share (%) of [0, seconds) that lies within one second
// after one of times.
func Coverage(times []float64, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	const step = 0.01
	n := 0
	for t := 0.0; t < seconds; t += step {
		for _, e := range times {
			if d := t - e; d >= 0 && d < 1 {
				n++
				break
			}
		}
	}
	return 100 * float64(n) * step / seconds
}

// Notes are the sentences a report's table needs besides its columns:
// what the bystander and frozen runs are, and how many backends a frozen
// run kept. The README's and docs/' tables (test/docsgen) print them too.
func Notes(r *Report) []string {
	var notes []string
	for _, x := range r.Runs {
		switch x.Phase {
		case "bystander":
			notes = append(notes, fmt.Sprintf("%s bystander: the backends steady while a Deployment behind no Service scales 5 <-> 7 on the same node.", x.Upstreams))
		case "frozen":
			notes = append(notes, fmt.Sprintf("%s frozen: the churn with steelyard's agent stopped (SIGSTOP) once its rules held the 5 backends, nginx serving; %d of the 5 still ran at the end.", x.Upstreams, x.FrozenKept))
		}
	}
	if r.NoLivenessProbe {
		notes = append(notes, "Every run without the DaemonSet's liveness probe (the frozen phase needs that).")
	}
	return notes
}
