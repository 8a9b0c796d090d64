// Command node-plot reads node-bench's JSON report on stdin, prints its
// table and draws the latency over time of the four runs (VIP or pod
// upstreams x steady or churn; p50, p99 and max per 0.5 s, log scale) with
// every scale event, EndpointSlice change, kernel sync and nginx reload
// marked, and the machine's CPU use below, into an SVG or PNG.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/steelyard-net/steelyard/test/bench/node/result"
	"github.com/steelyard-net/steelyard/test/bench/plotfile"
)

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}
	gray   = color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 255}
)

func main() {
	out := flag.String("o", "docs/bench-node.svg", "output file (.svg or .png)")
	flag.Parse()
	var rep result.Report
	if err := json.NewDecoder(os.Stdin).Decode(&rep); err != nil {
		fail(err)
	}
	result.Table(os.Stdout, &rep)
	// One latency range for every panel, so they compare at a glance.
	lo, hi := 0.1, 1.0
	for _, r := range rep.Runs {
		hi = max(hi, r.Max)
	}
	// Headroom above the data for the legend and the scale labels.
	top := hi * 1.5
	hi *= 20
	// The panels: the report's upstream modes down, its phases across.
	var phases, modes []string
	for _, r := range rep.Runs {
		if !slices.Contains(modes, r.Upstreams) {
			modes = append(modes, r.Upstreams)
		}
		if !slices.Contains(phases, r.Phase) {
			phases = append(phases, r.Phase)
		}
	}
	plots := make([][]*plot.Plot, len(modes)+1)
	for i, mode := range modes {
		plots[i] = make([]*plot.Plot, len(phases))
		for j, phase := range phases {
			for _, r := range rep.Runs {
				if r.Upstreams == mode && r.Phase == phase {
					plots[i][j] = latency(r, rep.Rate, lo, hi, top, i == 1 && j == 0)
				}
			}
		}
	}
	plots[len(modes)] = make([]*plot.Plot, len(phases))
	for j, phase := range phases {
		plots[len(modes)][j] = cpu(rep, phase)
	}
	if err := plotfile.Save(*out, 15*vg.Inch, 11*vg.Inch, plots); err != nil {
		fail(err)
	}
}

// latency is one run's panel.
func latency(r result.Run, rate int, lo, hi, top float64, legend bool) *plot.Plot {
	p := plot.New()
	up := "VIP upstreams"
	if r.Upstreams == "pods" {
		up = "upstreams=pods"
	}
	p.Title.Text = fmt.Sprintf("%s, %s, %d req/s: p99.9 %.1f ms, max %.0f ms, %d errors, %d reloads", up, r.Phase, rate, r.P999, r.Max, r.Errors, r.Reloads)
	p.X.Label.Text = "seconds"
	// Short: gonum places the Y label's box at the linear middle of the
	// range, near the top of a log axis, and a long one shrinks the plot.
	p.Y.Label.Text = "ms per 0.5 s"
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = lo, hi
	p.X.Min = 0
	if n := len(r.Series); n > 0 {
		p.X.Max = r.Series[n-1].T + 0.5
	}
	p.Add(plotter.NewGrid())
	series := []struct {
		name  string
		c     color.Color
		width vg.Length
		get   func(result.Point) float64
	}{
		{"max", red, 0.6, func(x result.Point) float64 { return x.Max }},
		{"p99", orange, 1, func(x result.Point) float64 { return x.P99 }},
		{"p50", blue, 1, func(x result.Point) float64 { return x.P50 }},
	}
	for _, s := range series {
		var xy plotter.XYs
		for _, x := range r.Series {
			if x.N > 0 {
				xy = append(xy, plotter.XY{X: x.T, Y: max(lo, s.get(x))})
			}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			fail(err)
		}
		l.Color, l.Width = s.c, vg.Points(float64(s.width))
		p.Add(l)
		if legend {
			p.Legend.Add(s.name, l)
		}
	}
	// Scale events: dashed verticals labelled with the replicas asked for.
	var lab plotter.XYLabels
	for _, e := range r.Scales {
		l, _ := plotter.NewLine(plotter.XYs{{X: e.T, Y: lo}, {X: e.T, Y: hi}})
		scaleStyle(l)
		p.Add(l)
		lab.XYs = append(lab.XYs, plotter.XY{X: e.T, Y: top})
		lab.Labels = append(lab.Labels, fmt.Sprintf(" to %d", e.Replicas))
	}
	if len(lab.XYs) > 0 {
		ls, err := plotter.NewLabels(lab)
		if err != nil {
			fail(err)
		}
		p.Add(ls)
	}
	marks := func(times []float64, y float64, shape draw.GlyphDrawer, c color.Color, _ string) {
		var xy plotter.XYs
		for _, t := range times {
			if t >= 0 {
				xy = append(xy, plotter.XY{X: t, Y: y})
			}
		}
		if len(xy) == 0 {
			return
		}
		s, err := plotter.NewScatter(xy)
		if err != nil {
			fail(err)
		}
		s.Shape, s.Color, s.Radius = shape, c, vg.Points(3.5)
		p.Add(s)
	}
	for _, m := range markers {
		marks(*m.times(&r), m.y(lo, top), m.shape, m.c, m.name)
	}
	if legend {
		l, _ := plotter.NewLine(plotter.XYs{{X: 0, Y: 1}})
		scaleStyle(l)
		p.Legend.Add("kubectl scale (to N replicas)", l)
		for _, m := range markers {
			s, _ := plotter.NewScatter(plotter.XYs{{X: 0, Y: 1}})
			s.Shape, s.Color, s.Radius = m.shape, m.c, vg.Points(3.5)
			p.Legend.Add(m.name, s)
		}
		p.Legend.Top, p.Legend.Left = true, true
	}
	return p
}

// markers are the events drawn as glyphs: where and how.
var markers = []struct {
	name  string
	times func(*result.Run) *[]float64
	y     func(lo, top float64) float64
	shape draw.GlyphDrawer
	c     color.Color
}{
	{"EndpointSlice change", func(r *result.Run) *[]float64 { return &r.SliceChanges }, func(lo, _ float64) float64 { return lo * 1.4 }, draw.PyramidGlyph{}, green},
	{"kernel sync (rule write)", func(r *result.Run) *[]float64 { return &r.SyncTimes }, func(lo, _ float64) float64 { return lo * 2.6 }, draw.BoxGlyph{}, blue},
	{"nginx reload", func(r *result.Run) *[]float64 { return &r.ReloadTimes }, func(_, top float64) float64 { return top * 2.5 }, draw.CrossGlyph{}, red},
}

// scaleStyle draws a scale event: a dashed gray vertical.
func scaleStyle(l *plotter.Line) {
	l.Color, l.Dashes, l.Width = gray, []vg.Length{vg.Points(3), vg.Points(3)}, vg.Points(0.8)
}

// cpu is the machine's CPU use during the runs of one phase.
func cpu(rep result.Report, phase string) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("machine CPU use, %s runs (%d CPUs, shared with other work); %d req/s", phase, rep.CPUs, rep.Rate)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "busy %"
	p.Y.Min, p.Y.Max = 0, 100
	p.Add(plotter.NewGrid())
	for k, r := range rep.Runs {
		if r.Phase != phase {
			continue
		}
		var xy plotter.XYs
		for _, x := range r.Series {
			xy = append(xy, plotter.XY{X: x.T, Y: x.CPU})
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			fail(err)
		}
		l.Color = []color.Color{blue, red}[k/2%2]
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s upstreams (mean %.0f%%, load %s)", r.Upstreams, r.CPUBusy, r.LoadAvg), l)
	}
	return p
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "node-plot:", err)
	os.Exit(1)
}
