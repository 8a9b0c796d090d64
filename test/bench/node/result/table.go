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
	fmt.Fprintln(w, "\nerrors by class, and nginx's upstream errors (its error log) by cause:")
	for _, x := range r.Runs {
		fmt.Fprintf(w, "  %s %s: %v; nginx %v\n", x.Upstreams, x.Phase, x.ErrClasses, x.NginxErrors)
	}
	fmt.Fprintln(w, "\nlatency from each request's due time (open loop); errors include timeouts; a slow request counts")
	fmt.Fprintln(w, "near an event when due within 1 s after it; CPU is the whole machine's (other work shares it).")
}
