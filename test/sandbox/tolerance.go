package sandbox

import "math"

// ShareTolerance is the tolerance, in percentage points, of a share check
// that allows sigmas standard deviations: a backend configured for percent
// of n independent new connections receives a binomial count, whose share
// has the standard deviation 100*sqrt(p(1-p)/n) points (p = percent/100).
// At 4 sigma a correct dataplane fails such a check about once in 16,000
// runs, at 4.5 once in 150,000. For the n a wanted tolerance needs, solve
// the same formula: n = p(1-p) * (100*sigmas/tol)^2.
//
// n <= 0 gives 0, so a run with no connection cannot pass by its tolerance.
func ShareTolerance(percent float64, n int, sigmas float64) float64 {
	if n <= 0 {
		return 0
	}
	p := percent / 100
	return sigmas * 100 * math.Sqrt(p*(1-p)/float64(n))
}
