package sandbox

import (
	"math"
	"testing"
)

func TestShareTolerance(t *testing.T) {
	for _, c := range []struct {
		percent float64
		n       int
		sigmas  float64
		want    float64
	}{
		// sqrt(.1*.9/20000) = 0.002121: 0.2121 points a sigma.
		{10, 20000, 1, 0.2121},
		{10, 20000, 4.7, 0.9970},
		// sqrt(.25/20000) = 0.003536.
		{50, 20000, 4, 1.4142},
		{20, 10000, 5, 2},
		{0, 1000, 4, 0},
		{100, 1000, 4, 0},
		{50, 0, 4, 0},
		{50, -1, 4, 0},
	} {
		if got := ShareTolerance(c.percent, c.n, c.sigmas); math.Abs(got-c.want) > 5e-5 {
			t.Errorf("ShareTolerance(%v, %d, %v) = %.5f, want %.4f", c.percent, c.n, c.sigmas, got, c.want)
		}
	}
}
