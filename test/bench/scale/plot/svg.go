package main

import (
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/vgsvg"
)

func newSVG(w, h vg.Length) *vgsvg.Canvas { return vgsvg.New(w, h) }
