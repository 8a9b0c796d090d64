package sandbox

import (
	"math"
	"sort"
	"testing"
	"time"
)

// ExpectShares checks a run of connections against configured shares: no
// connection failed, each pod's observed share is within tol points of
// want, and no other pod answered. It logs each figure with its standard
// deviation, so a passing run still shows how close it came.
func ExpectShares(t testing.TB, r Result, want map[string]float64, tol float64) {
	t.Helper()
	t.Logf("%v", r)
	if r.Failed() > 0 || r.Attempted != r.Requested {
		t.Errorf("%d of %d connections failed, %d not attempted: %v", r.Failed(), r.Requested, r.Requested-r.Attempted, r.Errors)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		got := r.Share(n)
		sigma := 100 * math.Sqrt(want[n]/100*(1-want[n]/100)/float64(max(r.OK(), 1)))
		t.Logf("  %-8s configured %6.2f%%  observed %6.2f%%  diff %+.2f points (sigma %.2f, tolerance %.1f)", n, want[n], got, got-want[n], sigma, tol)
		if math.Abs(got-want[n]) > tol {
			t.Errorf("%s: observed %.2f%%, configured %.2f%%: off by more than %.1f points", n, got, want[n], tol)
		}
	}
	for n, c := range r.Counts {
		if _, ok := want[n]; !ok {
			t.Errorf("%s answered %d connections but is not a configured backend", n, c)
		}
	}
}

// Poll calls f every interval until it reports done and returns the time
// that took; after timeout it fails the test with f's last detail.
func Poll(t testing.TB, timeout, interval time.Duration, what string, f func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, detail := f()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v: %s", what, timeout, detail)
		}
		time.Sleep(interval)
	}
}
