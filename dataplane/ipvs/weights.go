package ipvs

import "math"

// IPVS weights are integers; the desired state's are float64 (a split across
// Services divides a part among the endpoints of one Service). IntWeights
// turns them into integers whose shares stay within ShareError of the exact
// shares.

// ShareError is the largest difference, in percentage points, between a
// destination's share of new connections with the integer weights and its
// exact share.
const ShareError = 0.01

// weightScale is the total the weights are scaled to when no small exact
// multiplier exists: each weight's rounding moves its share by at most
// 0.5/weightScale, far inside ShareError for any realistic endpoint count,
// and the largest weight stays far below IPVS's int32 limit.
const weightScale = 1_000_000

// maxExactMultiplier bounds the search for a multiplier that makes every
// weight an integer (a split of 90/10 over 3 and 2 endpoints needs 6).
const maxExactMultiplier = 1000

// IntWeights returns IPVS weights for ws. Zero (and negative) weights stay 0;
// a positive weight never becomes 0. Integral weights are kept as they are
// (so ipvsadm shows the annotation's numbers); fractional ones are multiplied
// by the smallest integer up to 1,000 that makes them all integral, else
// scaled to a total of 1,000,000, rounded and reduced by their common divisor.
func IntWeights(ws []float64) []int {
	out := make([]int, len(ws))
	var sum, largest float64
	for _, w := range ws {
		if w > 0 {
			sum += w
			largest = max(largest, w)
		}
	}
	if sum == 0 {
		return out
	}
	for m := 1; m <= maxExactMultiplier; m++ {
		if largest*float64(m) > math.MaxInt32 {
			break
		}
		if exact(ws, float64(m), out) {
			return out
		}
	}
	for i, w := range ws {
		if w > 0 {
			out[i] = max(1, int(math.Round(w*weightScale/sum)))
		} else {
			out[i] = 0
		}
	}
	g := 0
	for _, w := range out {
		g = gcd(g, w)
	}
	if g > 1 {
		for i := range out {
			out[i] /= g
		}
	}
	return out
}

// exact fills out with ws*m and reports whether every product is an integer.
func exact(ws []float64, m float64, out []int) bool {
	for i, w := range ws {
		if w <= 0 {
			out[i] = 0
			continue
		}
		x := w * m
		r := math.Round(x)
		if r < 1 || math.Abs(x-r) > 1e-9*max(1, x) {
			return false
		}
		out[i] = int(r)
	}
	return true
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// kernelSchedulers are the IPVS schedulers Linux ships (ip_vs_<name>
// modules); the fake accepts only these, as the kernel would.
var kernelSchedulers = map[string]bool{
	"rr": true, "wrr": true, "lc": true, "wlc": true, "lblc": true, "lblcr": true, "dh": true,
	"sh": true, "mh": true, "sed": true, "nq": true, "fo": true, "ovf": true, "twos": true,
}

func validScheduler(s string) bool { return kernelSchedulers[s] }
