package iptables

import (
	"strconv"
)

// How weights become probabilities.
//
// iptables walks a Service chain top to bottom; each endpoint rule matches a
// new connection with `-m statistic --mode random --probability p`. For the
// connection to land on endpoint i with share w_i / W, the rule for i must
// match with the probability that it is chosen given that no earlier rule
// matched:
//
//	p_i = w_i / (w_i + w_{i+1} + ... + w_{n-1})
//
// The last endpoint's p is 1: its rule is unconditional, so no connection
// falls through the chain because of rounding.

// Probabilities returns p_i for weights, which must all be positive. The last
// element is always exactly 1.
func Probabilities(weights []float64) []float64 {
	p := make([]float64, len(weights))
	var rest float64
	for i := len(weights) - 1; i >= 0; i-- {
		rest += weights[i]
		p[i] = weights[i] / rest
	}
	if len(p) > 0 {
		p[len(p)-1] = 1
	}
	return p
}

// probabilityDigits is how many decimals a probability is printed with.
// The kernel keeps p as round(p * 2^31) (about 4.7e-10 resolution) and ten
// decimals keep each printed p within 5e-11 of the exact value, so shares
// rebuilt from the printed rules are exact to far better than 1e-6 even for
// weights 1 and 65535 side by side.
const probabilityDigits = 10

// FormatProbability prints p the way the rules carry it.
func FormatProbability(p float64) string {
	return strconv.FormatFloat(p, 'f', probabilityDigits, 64)
}

// Shares rebuilds each endpoint's share from the rule probabilities: the
// inverse of Probabilities, used by tests and by the tracer's reasoning.
func Shares(probabilities []float64) []float64 {
	s := make([]float64, len(probabilities))
	remaining := 1.0
	for i, p := range probabilities {
		s[i] = remaining * p
		remaining *= 1 - p
	}
	return s
}
