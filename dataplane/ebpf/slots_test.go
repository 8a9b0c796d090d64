package ebpf

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The oracle: share_i = w_i / sum(w), computed here independently of Fill.
func shares(weights []float64) []float64 {
	var sum float64
	for _, w := range weights {
		if w > 0 {
			sum += w
		}
	}
	out := make([]float64, len(weights))
	for i, w := range weights {
		if w > 0 {
			out[i] = w / sum
		}
	}
	return out
}

func TestFillExact(t *testing.T) {
	for _, tc := range []struct {
		weights []float64
		counts  []int
	}{
		{[]float64{10, 90}, []int{1, 9}},
		{[]float64{1, 2, 3, 4}, []int{1, 2, 3, 4}},
		{[]float64{1, 0, 1}, []int{1, 0, 1}}, // weight 0 drains
		{[]float64{20, 80}, []int{1, 4}},
		{[]float64{0.5, 1.5}, []int{1, 3}},
		{[]float64{33.3, 66.7}, []int{333, 667}},
		{[]float64{1, 1, 1}, []int{1, 1, 1}},
		{[]float64{4095, 1}, []int{4095, 1}},
	} {
		counts, n := Fill(tc.weights)
		sum := 0
		for i, c := range counts {
			sum += c
			if c != tc.counts[i] {
				t.Errorf("Fill(%v) = %v, want %v", tc.weights, counts, tc.counts)
				break
			}
		}
		if n != sum {
			t.Errorf("Fill(%v): n %d, slots %d", tc.weights, n, sum)
		}
		want := shares(tc.weights)
		for i, c := range counts {
			if got := float64(c) / float64(n); math.Abs(got-want[i]) > 1e-12 {
				t.Errorf("Fill(%v): share %d = %v, want exactly %v", tc.weights, i, got, want[i])
			}
		}
	}
}

func TestFillNothing(t *testing.T) {
	for _, w := range [][]float64{nil, {0}, {0, 0}, {-1, 0}} {
		if counts, n := Fill(w); n != 0 || len(counts) != len(w) {
			t.Errorf("Fill(%v) = %v, %d; want no slots", w, counts, n)
		}
	}
}

// TestFillBound checks the documented bound: every share is within 1/n
// of its weight's share, n <= MaxSlots, and weight 0 gets no slot.
func TestFillBound(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		weights := make([]float64, 1+r.IntN(40))
		for i := range weights {
			switch r.IntN(4) {
			case 0:
				weights[i] = 0
			case 1:
				weights[i] = float64(r.IntN(1000))
			default:
				weights[i] = r.Float64() * 100 // inexact: the MaxSlots table
			}
		}
		counts, n := Fill(weights)
		want := shares(weights)
		if n > MaxSlots {
			t.Fatalf("Fill(%v): %d slots > MaxSlots", weights, n)
		}
		if n == 0 {
			continue
		}
		for i, c := range counts {
			if weights[i] <= 0 && c != 0 {
				t.Fatalf("Fill(%v): weight 0 got %d slots", weights, c)
			}
			if d := math.Abs(float64(c)/float64(n) - want[i]); d >= 1/float64(n) {
				t.Fatalf("Fill(%v): share %d off by %v >= 1/%d", weights, i, d, n)
			}
		}
	}
}
