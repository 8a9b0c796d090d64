package viewcheck

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// FindObserved returns the observed view of vip:port in the output of
// `explain --observed -o json`, or fails the test.
func FindObserved(t testing.TB, out, vip string, port uint16) dataplane.ObservedView {
	t.Helper()
	var views []dataplane.ObservedView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("explain --observed -o json: %v\n%s", err, out)
	}
	for _, v := range views {
		if v.VIP == vip && v.Port == port {
			return v
		}
	}
	t.Fatalf("explain --observed has no %s:%d:\n%s", vip, port, out)
	return dataplane.ObservedView{}
}

// ExpectObserved compares the kernel's counts (an observed view) with a
// client's run r: each endpoint's count equal to the connections the
// client got answered by that pod (names: endpoint IP -> pod name), the
// total equal to all the client made, each observed share within tol
// points of want (by pod name), and the binomial check at noise. Equal is
// a real check only if no connection failed (a connection that timed out
// may be counted where the client cannot tell), so a failure fails here.
func ExpectObserved(t testing.TB, got dataplane.ObservedView, r sandbox.Result, names map[string]string, want map[string]float64, tol float64) {
	t.Helper()
	if r.Failed() > 0 || r.Attempted != r.Requested {
		t.Fatalf("%d of %d connections failed, %d not attempted (%v): the kernel's count cannot be compared", r.Failed(), r.Requested, r.Requested-r.Attempted, r.Errors)
	}
	if got.Total != uint64(r.OK()) {
		t.Errorf("kernel counted %d new connections, the client made %d", got.Total, r.OK())
	}
	if got.Verdict != dataplane.VerdictNoise {
		t.Errorf("verdict %q, want %q: %+v", got.Verdict, dataplane.VerdictNoise, got)
	}
	for _, b := range got.Backends {
		name := names[b.IP]
		if b.Count != uint64(r.Counts[name]) {
			t.Errorf("%s (%s): kernel counted %d, the client got %d answers from it", b.IP, name, b.Count, r.Counts[name])
		}
		if math.Abs(b.Configured-want[name]) > dataplane.ShareTolerance {
			t.Errorf("%s: configured %.3f%%, want %.3f%%", b.IP, b.Configured, want[name])
		}
		if math.Abs(b.Observed-want[name]) > tol {
			t.Errorf("%s: observed %.3f%%, want %.3f%% within %.1f points", b.IP, b.Observed, want[name], tol)
		}
	}
}
