// Package plotfile writes a grid of gonum plots to one SVG or PNG file (by
// the name's extension), aligned as the benchmarks' pictures are
// (test/bench/scale/plot, test/bench/node/plot).
package plotfile

import (
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Tiles is the padding every picture uses between and around its plots.
func Tiles(rows, cols int) draw.Tiles {
	return draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
}

// Save draws plots (rows of columns; nil cells stay empty) on a width x
// height canvas and writes it to path: PNG if path ends in .png, else SVG.
func Save(path string, width, height vg.Length, plots [][]*plot.Plot) error {
	var c draw.Canvas
	var write func(f *os.File) error
	if strings.HasSuffix(path, ".png") {
		img := vgimg.New(width, height)
		c = draw.New(img)
		write = func(f *os.File) error { _, err := vgimg.PngCanvas{Canvas: img}.WriteTo(f); return err }
	} else {
		svg := vgsvg.New(width, height)
		c = draw.New(svg)
		write = func(f *os.File) error { _, err := svg.WriteTo(f); return err }
	}
	cols := 0
	for _, r := range plots {
		cols = max(cols, len(r))
	}
	canvases := plot.Align(plots, Tiles(len(plots), cols), c)
	for i := range plots {
		for j := range plots[i] {
			if plots[i][j] != nil {
				plots[i][j].Draw(canvases[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
