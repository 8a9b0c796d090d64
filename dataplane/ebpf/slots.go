package ebpf

import (
	"math"
	"sort"
)

// MaxSlots is the largest slot table of one Service port.
//
// A connection picks slot bpf_get_prandom_u32() % n of a table of n slots,
// so backend i gets c_i/n of the new connections, where c_i is its number
// of slots (the modulo's bias is below n/2^32, under 1e-6 for n <= 4096).
// Fill makes the table exact where it can: weights that are integers (or
// decimals of up to three places, as splits and percentages give) are
// reduced by their greatest common divisor, and when their sum then fits
// in MaxSlots, c_i/n = w_i/W exactly (10/90 is 1 and 9 slots, 1:2:3:4 is
// 10 slots). Otherwise the table has MaxSlots slots filled by largest
// remainder: c_i is floor(n*w_i/W) or one more, so each share is off by
// less than 1/n = 1/4096 of the connections (0.0245 percentage points).
const MaxSlots = 4096

// Fill returns the number of slots each weight gets (weights <= 0 get
// none: weight 0 drains) and the table size n = their sum; n is 0 when no
// weight is positive.
func Fill(weights []float64) (counts []int, n int) {
	counts = make([]int, len(weights))
	if ints, ok := exactInts(weights); ok {
		g := 0
		for _, w := range ints {
			g = gcd(g, w)
		}
		sum := 0
		for _, w := range ints {
			sum += w / max(g, 1)
		}
		if sum > 0 && sum <= MaxSlots {
			for i, w := range ints {
				counts[i] = w / g
			}
			return counts, sum
		}
	}
	var total float64
	for _, w := range weights {
		if w > 0 {
			total += w
		}
	}
	if total == 0 {
		return counts, 0
	}
	// Largest remainder: the floors, then one more slot each to the
	// largest fractional parts (ties to the earlier weight) until the
	// table is full.
	type rem struct {
		i    int
		frac float64
	}
	var rems []rem
	used := 0
	for i, w := range weights {
		if w <= 0 {
			continue
		}
		q := float64(MaxSlots) * w / total
		counts[i] = int(math.Floor(q))
		used += counts[i]
		rems = append(rems, rem{i, q - math.Floor(q)})
	}
	sort.SliceStable(rems, func(a, b int) bool { return rems[a].frac > rems[b].frac })
	for k := 0; used < MaxSlots && k < len(rems); k++ {
		counts[rems[k].i]++
		used++
	}
	return counts, used
}

// exactInts returns the weights scaled to integers (weights <= 0 as 0)
// when each is an integer, or a decimal of at most three places, and the
// scaled sum stays small; false otherwise.
func exactInts(weights []float64) ([]int, bool) {
	for _, scale := range []float64{1, 10, 100, 1000} {
		out := make([]int, len(weights))
		ok := true
		for i, w := range weights {
			if w <= 0 {
				continue
			}
			x := w * scale
			r := math.Round(x)
			if math.Abs(x-r) > 1e-9*math.Max(1, x) || r > 1<<40 {
				ok = false
				break
			}
			out[i] = int(r)
		}
		if ok {
			return out, true
		}
	}
	return nil, false
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
