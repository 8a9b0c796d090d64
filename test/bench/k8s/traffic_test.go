package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
)

func TestParseTrafficSizes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
		none bool
		bad  bool
	}{
		{in: "all"}, {in: ""}, {in: "none", none: true},
		{in: "1000, 30000", want: []int{1000, 30000}},
		{in: "1000,x", bad: true}, {in: "0", bad: true},
	} {
		got, none, err := parseTrafficSizes(c.in)
		if (err != nil) != c.bad || none != c.none || !slices.Equal(got, c.want) {
			t.Errorf("parseTrafficSizes(%q) = %v, %v, %v; want %v, %v, error %v", c.in, got, none, err, c.want, c.none, c.bad)
		}
	}
	on := trafficConfig{conns: 1, workers: 1, duration: time.Second}
	list := on
	list.sizes = []int{1000}
	off := on
	off.none = true
	if !on.at(100) || !list.at(1000) || list.at(100) || off.at(1000) {
		t.Errorf("at: all %v, list 1000 %v / 100 %v, none %v", on.at(100), list.at(1000), list.at(100), off.at(1000))
	}
}

// startBackends serves the protocol on two loopback ports, as backends
// 'a' and 'b'.
func startBackends(t *testing.T) (a, b string) {
	t.Helper()
	var addrs []string
	for _, id := range []byte{'a', 'b'} {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := serveBackend(l, id)
		t.Cleanup(s.close)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs[0], addrs[1]
}

// TestTrafficClientLoopback runs the child's whole path (job in, JSON out)
// against two loopback servers standing for the VIP and the direct pod.
func TestTrafficClientLoopback(t *testing.T) {
	a, b := startBackends(t)
	job := trafficJob{VIP: a, Direct: b, Conns: 50, Limit: 20 * time.Second, Duration: 300 * time.Millisecond,
		Workers: 2, Ready: 5 * time.Second, Timeout: 2 * time.Second}
	in, _ := json.Marshal(job)
	var stdout bytes.Buffer
	if code := trafficClient(bytes.NewReader(in), &stdout); code != 0 {
		t.Fatalf("exit %d", code)
	}
	out, err := parseTrafficOutput(stdout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if out.Error != "" || len(out.FirstVIP) != 50 || len(out.FirstDirect) != 50 || out.FirstVIPErrors+out.FirstDirErrors != 0 {
		t.Fatalf("first byte: error %q, %d VIP and %d direct samples, %d+%d errors", out.Error, len(out.FirstVIP), len(out.FirstDirect), out.FirstVIPErrors, out.FirstDirErrors)
	}
	for _, r := range []rate{out.NewVIP, out.NewDirect, out.KeepVIP, out.KeepDirect} {
		if r.Requests == 0 || r.Errors != 0 || r.Seconds <= 0 {
			t.Errorf("rate %+v: want requests, no errors", r)
		}
	}
	// The paths share each mode's 2 x 0.3 s of wall time (less the
	// loop's own time, plus the last pair's overrun on a loaded machine).
	for _, pair := range [][2]rate{{out.NewVIP, out.NewDirect}, {out.KeepVIP, out.KeepDirect}} {
		if sum := pair[0].Seconds + pair[1].Seconds; sum < 0.3 || sum > 1 {
			t.Errorf("VIP %.3f s + direct %.3f s = %.3f s, want about 0.6 s", pair[0].Seconds, pair[1].Seconds, sum)
		}
	}
	// Every answer through the "VIP" came from backend a: the first-byte
	// samples and each new-connection request.
	if want := 50 + out.NewVIP.Requests; out.IDs["a"] != want || len(out.IDs) != 1 {
		t.Errorf("backend IDs %v, want a=%d only", out.IDs, want)
	}
}

// TestTrafficNoAnswer: a VIP that reaches no backend fails the phase with
// a message that says so, within the readiness bound.
func TestTrafficNoAnswer(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	_, b := startBackends(t)
	start := time.Now()
	out := measureTraffic(context.Background(), trafficJob{VIP: dead, Direct: b, Conns: 10, Ready: 500 * time.Millisecond, Timeout: time.Second})
	if !strings.Contains(out.Error, "the VIP path does not reach the backends") || !strings.Contains(out.Error, dead) || len(out.FirstVIP) != 0 {
		t.Errorf("error %q, %d samples", out.Error, len(out.FirstVIP))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v, want about the 0.5 s readiness bound", d)
	}
}

// TestExchange: a request on a new connection reads the backend's ID and
// its answer; a server that does not answer fails it within the timeout.
func TestExchange(t *testing.T) {
	a, _ := startBackends(t)
	id, d, err := exchange(a, time.Second)
	if err != nil || id != 'a' || d <= 0 {
		t.Fatalf("exchange: %q %v %v", id, d, err)
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte{'x'})
		time.Sleep(2 * time.Second)
	}()
	start := time.Now()
	if _, _, err := exchange(l.Addr().String(), 300*time.Millisecond); err == nil || !strings.Contains(err.Error(), "answer") || time.Since(start) > 1500*time.Millisecond {
		t.Errorf("exchange with a server that does not answer: %v after %v", err, time.Since(start))
	}
}

func TestParseTrafficOutput(t *testing.T) {
	if _, err := parseTrafficOutput([]byte(`{"first_vip_s":[0.001],"new_vip":{"requests":5,"errors":0,"seconds":1}}`)); err != nil {
		t.Errorf("good output: %v", err)
	}
	for _, bad := range []string{``, `{"nope":1}`, `{} {}`, `{"first_vip_s":"x"}`} {
		if _, err := parseTrafficOutput([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestTrafficFigures checks the percentiles, rates, shares, point fields
// and goal lines computed from known samples.
func TestTrafficFigures(t *testing.T) {
	ms := func(k int) []float64 {
		s := make([]float64, 100)
		for i := range s {
			s[i] = float64(k*(100-i)) / 1000 // unsorted: k*100 ms down to k ms
		}
		return s
	}
	mk := func(name string, first []float64, newVIP int) result {
		return result{proxy: proxy{name: name}, services: 1000, traffic: &trafficResult{weighted: name != proxyKubeProxyNFTables, out: trafficOutput{
			FirstVIP: first, FirstDirect: ms(1),
			NewVIP: rate{Requests: newVIP, Seconds: 5}, NewDirect: rate{Requests: 1000, Seconds: 5},
			KeepVIP: rate{Requests: 2000, Seconds: 5}, KeepDirect: rate{Requests: 2500, Seconds: 5},
			IDs: map[string]int{"a": 100, "b": 900},
		}}}
	}
	nft := mk(proxySteelyardNFTables, ms(2), 950)
	ebpf := mk("steelyard-ebpf", ms(1), 990)
	kp := mk(proxyKubeProxyNFTables, ms(3), 900)
	failed := result{proxy: proxy{name: proxyKubeProxyNFTables}, services: 30000, traffic: &trafficResult{err: "the VIP path does not reach the backends: x"}}

	tr := nft.traffic
	if p50, _ := tr.firstByte(false, 0.5); p50 != 100*time.Millisecond {
		t.Errorf("VIP p50 %v, want 100ms (nearest rank of 2..200 ms)", p50)
	}
	if p99, _ := tr.firstByte(true, 0.99); p99 != 99*time.Millisecond {
		t.Errorf("direct p99 %v, want 99ms", p99)
	}
	if share, n := tr.shareA(); share != 10 || n != 1000 || tr.wantShareA() != 10 || kp.traffic.wantShareA() != 50 {
		t.Errorf("share %v of %d, want 10 of 1000; want shares %v, %v", share, n, tr.wantShareA(), kp.traffic.wantShareA())
	}
	var p point.Result
	tr.fill(&p)
	if p.FirstPacketP50 != 0.1 || p.FirstPacketP99 != 0.198 || p.DirectFirstPacketP50 != 0.05 || p.DirectFirstPacketP99 != 0.099 ||
		p.RPSNewVIP != 190 || p.RPSNewDirect != 200 || p.RPSKeepaliveVIP != 400 || p.RPSKeepaliveDirect != 500 {
		t.Errorf("point %+v", p)
	}
	var none point.Result
	failed.traffic.fill(&none)
	(*trafficResult)(nil).fill(&none)
	if none != (point.Result{}) {
		t.Errorf("a failed phase filled %+v", none)
	}

	goals := strings.Join(trafficGoals([]result{nft, ebpf, kp, failed}), "\n")
	for _, want := range []string{
		"N=1000, steelyard nftables: new-connection req/s VIP / direct 0.95x (goal >= 0.98); first byte p50 VIP / direct 2.00x",
		"N=1000, steelyard ebpf / steelyard nftables: first byte p50 through the VIP 0.50x (goal <= 0.7)",
	} {
		if !strings.Contains(goals, want) {
			t.Errorf("goals lack %q:\n%s", want, goals)
		}
	}
	var out bytes.Buffer
	printTraffic(&out, []result{nft, failed, {proxy: proxy{name: proxySteelyard}}})
	for _, want := range []string{"100000µs / 198000µs", "190 / 200 (0.95x)", "10.0% of 1000 (10 ± 3.8)", "failed: the VIP path does not reach"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printTraffic(&out, []result{{proxy: proxy{name: proxySteelyard}}})
	if out.Len() != 0 {
		t.Errorf("a run without the phase printed:\n%s", out.String())
	}
}

// fakeRequester takes 5 ms through the VIP (answering as backend b) and
// 15 ms direct, where every third request fails.
// fakeRequester takes 5 ms of virtual time per VIP request and 15 ms per
// direct one, every third of which is refused.
type fakeRequester struct {
	n   int
	clk *virtualClock
}

func (f *fakeRequester) request(vip bool) (byte, error) {
	if vip {
		f.clk.advance(5 * time.Millisecond)
		return 'b', nil
	}
	f.clk.advance(15 * time.Millisecond)
	if f.n++; f.n%3 == 0 {
		return 0, errors.New("refused")
	}
	return 0, nil
}

// virtualClock is a clock that moves only when told.
type virtualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *virtualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *virtualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func (*fakeRequester) close() {}

// TestPairedRates: each path's rate is its requests over the time they
// took, so a path three times as slow shows a third of the rate although both made the
// same number of requests.
func TestPairedRates(t *testing.T) {
	// One worker on a virtual clock: the rates are exact, whatever the
	// machine's load (with real sleeps the ratio fell to 0.62 once).
	clk := &virtualClock{t: time.Unix(1000, 0)}
	pairedClock = clk.now
	defer func() { pairedClock = time.Now }()
	ids := map[string]int{}
	vip, direct := pairedRates(func() requester { return &fakeRequester{clk: clk} }, 1, 500*time.Millisecond, ids)
	if vip.Requests == 0 || vip.Errors != 0 || ids["b"] != vip.Requests {
		t.Fatalf("VIP %+v, IDs %v", vip, ids)
	}
	if all := direct.Requests + direct.Errors; all < vip.Requests-2 || all > vip.Requests+2 || direct.Errors < all/3-2 || direct.Errors > all/3+2 || direct.FirstError != "refused" {
		t.Errorf("direct %+v: want as many requests as the VIP's %d, a third failed (each worker's every third)", direct, vip.Requests)
	}
	// Sleeps overshoot by some ms on a loaded machine: the slower path
	// shows the lower rate, and the paths share the 0.5 s of wall time.
	attempts := float64(direct.Requests+direct.Errors) / direct.Seconds
	if r := ratio(vip.perSecond(), attempts); r < 2.99 || r > 3.01 {
		t.Errorf("VIP %.0f/s vs direct %.0f attempts/s: ratio %.2f, want 3", vip.perSecond(), attempts, r)
	}
	if sum := vip.Seconds + direct.Seconds; sum < 0.5 || sum > 0.52 {
		t.Errorf("VIP %.3f s + direct %.3f s = %.3f s, want 0.5 s (and one last round)", vip.Seconds, direct.Seconds, sum)
	}
}
