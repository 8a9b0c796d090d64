package controller

import (
	"fmt"
	"strings"
)

// AnnotationScheduler on a Service picks the IPVS scheduler of its ports in
// --mode ipvs (other dataplanes ignore it); without it the node's
// --ipvs-scheduler applies.
const AnnotationScheduler = "steelyard.io/ipvs-scheduler"

// Schedulers are the accepted values of AnnotationScheduler: round robin,
// weighted round robin, least connection, weighted least connection, source
// hashing and Maglev hashing.
var Schedulers = []string{"rr", "wrr", "lc", "wlc", "sh", "mh"}

// ParseScheduler validates an AnnotationScheduler value; surrounding spaces
// are ignored and case is not.
func ParseScheduler(s string) (string, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	for _, ok := range Schedulers {
		if v == ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("unknown IPVS scheduler %q (want one of %s)", s, strings.Join(Schedulers, ", "))
}
