// Command scale-plot reads the JSON lines of scale-bench from stdin, prints
// them as a table and draws each cost against the number of Services (log
// scales, one line per dataplane) into an SVG or PNG. Points of k8s-bench
// (steelyard and kube-proxy against a real API server, "(API server)" in
// their name) are drawn beside them where they measured the same thing
// (first sync, peak RSS) and alone in the change -> kernel panel.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/steelyard-net/steelyard/test/bench/plotfile"
)

func main() {
	out := flag.String("o", "docs/bench-scale.svg", "output file (.svg or .png)")
	flag.Parse()
	var rs []point.Result
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var r point.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err == nil && r.Services > 0 {
			rs = append(rs, r)
		}
	}
	rs = lastPoints(rs)
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].Dataplane != rs[j].Dataplane {
			return rs[i].Dataplane < rs[j].Dataplane
		}
		return rs[i].Services < rs[j].Services
	})
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "wall time (CPU time)\t\t\t\t\t\t\t\t\t")
	fmt.Fprintln(w, "dataplane\tServices\tfirst sync\tpartial sync\tfull resync\texplain\tlist ruleset\tRSS\tload\t")
	for _, r := range rs {
		if r.ChangeP99 > 0 || strings.HasSuffix(r.Dataplane, apiServerSuffix) {
			continue // below
		}
		fmt.Fprintf(w, "%s\t%d\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.0f MiB\t%s\t\n", r.Dataplane, r.Services,
			r.First, r.FirstCPU, r.Partial, r.PartialCPU, r.Full, r.FullCPU, r.Explain, r.ExplainCPU, r.List, r.ListCPU, r.RSSMiB, r.LoadAvg)
	}
	w.Flush()
	w = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "\nagainst a real API server (k8s-bench)\t\t\t\t\t\t\t")
	fmt.Fprintln(w, "proxy\tServices\tfirst sync\tchange -> kernel p50\tp99\tRSS\tload\t")
	for _, r := range rs {
		if strings.HasSuffix(r.Dataplane, apiServerSuffix) {
			fmt.Fprintf(w, "%s\t%d\t%.2f s\t%.3f s\t%.3f s\t%.0f MiB\t%s\t\n", strings.TrimSuffix(r.Dataplane, apiServerSuffix), r.Services,
				r.First, r.ChangeP50, r.ChangeP99, r.RSSMiB, r.LoadAvg)
		}
	}
	w.Flush()

	metrics := []struct {
		title string
		unit  string
		get   func(point.Result) float64
	}{
		{"first sync", "seconds", func(r point.Result) float64 { return r.First }},
		{"one endpoint change (partial sync)", "seconds", func(r point.Result) float64 { return r.Partial }},
		{"endpoint change -> kernel p99", "seconds", func(r point.Result) float64 { return r.ChangeP99 }},
		{"full resync, nothing changed", "seconds", func(r point.Result) float64 { return r.Full }},
		{"explain", "seconds", func(r point.Result) float64 { return r.Explain }},
		{"list the ruleset", "seconds", func(r point.Result) float64 { return r.List }},
		{"peak RSS", "MiB", func(r point.Result) float64 { return r.RSSMiB }},
	}
	const cols = 4
	rows := (len(metrics) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	colorOf := map[string]color.Color{}
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255}}
	i := 0 // panels drawn: a metric without points has none
	for _, m := range metrics {
		p := plot.New()
		p.Title.Text = m.title
		p.X.Label.Text = "Services (x10 endpoints)"
		p.Y.Label.Text = m.unit
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		byDP := map[string]plotter.XYs{}
		var names []string
		for _, r := range rs {
			// One color per name in every panel.
			if _, ok := colorOf[r.Dataplane]; !ok {
				colorOf[r.Dataplane] = colors[len(colorOf)%len(colors)]
			}
			v := m.get(r)
			if v <= 0 {
				continue
			}
			if _, ok := byDP[r.Dataplane]; !ok {
				names = append(names, r.Dataplane)
			}
			byDP[r.Dataplane] = append(byDP[r.Dataplane], plotter.XY{X: float64(r.Services), Y: v})
		}
		for _, n := range names {
			l, pts, err := plotter.NewLinePoints(byDP[n])
			if err != nil {
				fail(err)
			}
			l.Color, pts.Color = colorOf[n], colorOf[n]
			p.Add(l, pts)
			p.Legend.Add(legend(n), l, pts)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		if len(names) == 0 {
			continue // log axes need a value
		}
		if plots[i/cols] == nil {
			plots[i/cols] = make([]*plot.Plot, cols)
		}
		plots[i/cols][i%cols] = p
		i++
	}
	plots = slices.DeleteFunc(plots, func(row []*plot.Plot) bool { return row == nil })
	if err := plotfile.Save(*out, 20*vg.Inch, 8*vg.Inch, plots); err != nil {
		fail(err)
	}
}

// legend names a line: scale-bench's points are steelyard's dataplane
// alone (no API server), k8s-bench's a proxy with its informers.
func legend(name string) string {
	if strings.HasSuffix(name, apiServerSuffix) {
		return name
	}
	return "steelyard " + name + " (dataplane alone)"
}

// apiServerSuffix ends the names of k8s-bench's points.
const apiServerSuffix = " (API server)"

// lastPoints keeps the last point of each name and size: k8s-bench
// appends its runs to one file, a rerun replacing the earlier one.
func lastPoints(rs []point.Result) []point.Result {
	type key struct {
		name     string
		services int
	}
	at := map[key]int{}
	var out []point.Result
	for _, r := range rs {
		k := key{r.Dataplane, r.Services}
		if i, ok := at[k]; ok {
			out[i] = r
			continue
		}
		at[k] = len(out)
		out = append(out, r)
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale-plot:", err)
	os.Exit(1)
}
