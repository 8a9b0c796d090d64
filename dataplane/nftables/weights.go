package nftables

import "slices"

// Buckets is the numgen modulus used when the weights are not small
// integers: each backend's share is then exact within 100/Buckets points
// (0.0001 points), far inside the 0.01 points steelyard promises.
const Buckets = 1000000

// Split returns the numgen modulus and each weight's count of buckets:
// the weights themselves when they are integers summing to at most
// Buckets (exact shares), else Buckets divided by largest remainder.
func Split(weights []float64) (uint64, []uint64) {
	counts := make([]uint64, len(weights))
	var sum float64
	integers := true
	for _, w := range weights {
		sum += w
		if w != float64(uint64(w)) {
			integers = false
		}
	}
	if sum <= 0 {
		return 0, counts
	}
	if integers && sum <= Buckets {
		for i, w := range weights {
			counts[i] = uint64(w)
		}
		return uint64(sum), counts
	}
	var used uint64
	rem := make([]float64, len(weights))
	for i, w := range weights {
		exact := w / sum * Buckets
		counts[i] = uint64(exact)
		rem[i] = exact - float64(counts[i])
		used += counts[i]
	}
	idx := make([]int, len(weights))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case rem[a] > rem[b]:
			return -1
		case rem[a] < rem[b]:
			return 1
		}
		return 0
	})
	for i := 0; used < Buckets; i = (i + 1) % len(idx) {
		counts[idx[i]]++
		used++
	}
	return Buckets, counts
}

// Ranges turns weights into consecutive ranges [lo, hi] of numgen values
// over the returned modulus: weight i owns counts_i values, so its share
// is exactly counts_i / modulus. A weight with no bucket gets hi < lo.
func Ranges(weights []float64) (uint64, [][2]uint64) {
	mod, counts := Split(weights)
	out := make([][2]uint64, len(weights))
	var lo uint64
	for i, c := range counts {
		out[i] = [2]uint64{lo, lo + c - 1}
		if c == 0 {
			out[i] = [2]uint64{lo + 1, lo}
		}
		lo += c
	}
	return mod, out
}
