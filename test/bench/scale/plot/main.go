// Command scale-plot reads the JSON lines of scale-bench from stdin, prints
// them as a table and draws each cost against the number of Services (log
// scales, one line per dataplane) into an SVG or PNG.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"sort"
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
		fmt.Fprintf(w, "%s\t%d\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.3f (%.3f) s\t%.0f MiB\t%s\t\n", r.Dataplane, r.Services,
			r.First, r.FirstCPU, r.Partial, r.PartialCPU, r.Full, r.FullCPU, r.Explain, r.ExplainCPU, r.List, r.ListCPU, r.RSSMiB, r.LoadAvg)
	}
	w.Flush()

	metrics := []struct {
		title string
		unit  string
		get   func(point.Result) float64
	}{
		{"first sync", "seconds", func(r point.Result) float64 { return r.First }},
		{"one endpoint change (partial sync)", "seconds", func(r point.Result) float64 { return r.Partial }},
		{"full resync, nothing changed", "seconds", func(r point.Result) float64 { return r.Full }},
		{"explain", "seconds", func(r point.Result) float64 { return r.Explain }},
		{"list the ruleset", "seconds", func(r point.Result) float64 { return r.List }},
		{"peak RSS", "MiB", func(r point.Result) float64 { return r.RSSMiB }},
	}
	const cols = 3
	rows := (len(metrics) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255}, color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}}
	for i, m := range metrics {
		p := plot.New()
		p.Title.Text = m.title
		p.X.Label.Text = "Services (x10 endpoints)"
		p.Y.Label.Text = m.unit
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		byDP := map[string]plotter.XYs{}
		var names []string
		for _, r := range rs {
			v := m.get(r)
			if v <= 0 {
				continue
			}
			if _, ok := byDP[r.Dataplane]; !ok {
				names = append(names, r.Dataplane)
			}
			byDP[r.Dataplane] = append(byDP[r.Dataplane], plotter.XY{X: float64(r.Services), Y: v})
		}
		for k, n := range names {
			l, pts, err := plotter.NewLinePoints(byDP[n])
			if err != nil {
				fail(err)
			}
			l.Color, pts.Color = colors[k%len(colors)], colors[k%len(colors)]
			p.Add(l, pts)
			p.Legend.Add(n, l, pts)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		if plots[i/cols] == nil {
			plots[i/cols] = make([]*plot.Plot, cols)
		}
		plots[i/cols][i%cols] = p
	}
	if err := plotfile.Save(*out, 15*vg.Inch, 8*vg.Inch, plots); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scale-plot:", err)
	os.Exit(1)
}
