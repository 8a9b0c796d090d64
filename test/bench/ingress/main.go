// Command ingress-bench measures the L7 layer under pod churn: a bounded
// constant-rate HTTP load through nginx, first with a steady backend, then
// while the backend's endpoints change 5 -> 7 -> 5 every --period; once
// with VIP upstreams (steelyard's design: nginx proxies to the Service VIP
// and the kernel picks the pod) and once with --ingress-upstreams=pods (pod
// IPs in the upstream, a reload per change, as nginx's own controller
// does). It prints one table and asserts nothing.
//
// The load is open-loop: request i is due at start + i/rate whatever
// happened to earlier ones, and its latency is measured from that due time,
// so a stalled server shows in the percentiles (no coordinated omission).
// A request still unanswered after --timeout counts as a timeout; the
// percentiles cover every request, failed ones at the time they failed.
//
// Everything runs in network namespaces of a sandbox (198.18.0.0/15
// addresses) against a real etcd and kube-apiserver; nothing touches the
// machine's own network namespace. Needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/ingress/harness"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

func main() {
	var (
		bin      = flag.String("steelyard", "bin/steelyard", "steelyard binary")
		rate     = flag.Int("rate", 500, "requests per second (open loop)")
		duration = flag.Duration("duration", 60*time.Second, "length of each phase (steady, churn)")
		period   = flag.Duration("period", 10*time.Second, "time between endpoint changes in the churn phase")
		timeout  = flag.Duration("timeout", 2*time.Second, "a request unanswered after this is a timeout")
		modes    = flag.String("modes", "vip,pods", "upstream modes to run")
		conns    = flag.Int("conns", 64, "client keepalive connections to nginx (idle pool size)")
	)
	flag.Parse()
	if *rate < 1 || *rate > 5000 || *duration < time.Second || *duration > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "ingress-bench: want 1 <= -rate <= 5000 and 1s <= -duration <= 10m")
		os.Exit(2)
	}
	stop := sandbox.CloseOnSignal()
	defer stop()
	var rows []row
	for _, mode := range strings.Split(*modes, ",") {
		r, err := runMode(mode, *bin, *rate, *duration, *period, *timeout, *conns)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ingress-bench: %s: %v\n", mode, err)
			os.Exit(1)
		}
		rows = append(rows, r...)
	}
	fmt.Printf("\nrate %d requests/s, %v per phase, churn 5 -> 7 -> 5 endpoints every %v, timeout %v\n\n", *rate, *duration, *period, *timeout)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "upstreams\tphase\trequests\terrors\ttimeouts\treloads\tp50\tp99\tp99.9\tmax\t>=50ms (<=1s after a change)\tload avg")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d (%d)\t%s\n", r.mode, r.phase, r.requests, r.errors, r.timeouts, r.reloads,
			ms(r.p50), ms(r.p99), ms(r.p999), ms(r.max), r.slow, r.slowNear, r.loadavg)
	}
	tw.Flush()
	fmt.Println("\nerrors include timeouts; percentiles cover every request, measured from its due time (open loop);")
	fmt.Println(">=50ms counts the slow requests and, in brackets, those due within 1 s after an endpoint change;")
	fmt.Println("load avg is the machine's 1-minute load average at the end of the phase (other work on the machine shows in the tails).")
}

type row struct {
	mode, phase                string
	requests, errors, timeouts int
	reloads                    int
	p50, p99, p999, max        time.Duration
	errClasses                 map[string]int
	loadavg                    string
	// due and lat are each request's due time and latency (request order).
	due []time.Time
	lat []time.Duration
	// slow counts requests of 50 ms or more, slowNear those of them due
	// within 1 s after an endpoint change.
	slow, slowNear int
}

// loadAvg returns the 1-minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

// runMode builds a world, runs the steady and churn phases, and tears it down.
func runMode(mode, bin string, rate int, duration, period, timeout time.Duration, conns int) ([]row, error) {
	ctx := context.Background()
	logf("%s: starting etcd and kube-apiserver", mode)
	cp, err := controlplane.StartProcess(ctx, controlplane.Options{ReducedAPIs: true})
	if err != nil {
		return nil, err
	}
	defer cp.Stop()
	sb, err := sandbox.New(sandbox.Options{Prefix: "syib"})
	if err != nil {
		return nil, err
	}
	defer sb.Close()
	w, err := harness.New(ctx, cp, sb, logf)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	var pods []string
	for i := 1; i <= 7; i++ {
		name := fmt.Sprintf("b%d", i)
		if _, err := w.AddPod(name, fmt.Sprintf("198.19.9.%d", i+1)); err != nil {
			return nil, err
		}
		pods = append(pods, name)
	}
	if err := w.Service(ctx, "bench", "198.18.2.10", nil); err != nil {
		return nil, err
	}
	if err := w.SetEndpoints(ctx, "bench", pods[:5]...); err != nil {
		return nil, err
	}
	if err := w.Apply(ctx, harness.IngressOf("bench", harness.Rule{Host: "bench.example", Paths: []harness.Path{{Path: "/", Type: "Prefix", Service: "bench"}}})); err != nil {
		return nil, err
	}
	if err := w.StartAgent(bin, "--ingress-upstreams", mode, "--log-level", "info"); err != nil {
		return nil, err
	}
	client := w.HTTPClient(nil, true, conns, timeout)
	// Warm up: connections open, the config settled.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := load(client, rate, time.Second, timeout); r.errors == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("nginx does not serve bench.example\n%s", harness.Tail(w.Agent.Log(), 30))
		}
	}
	time.Sleep(time.Second)
	var rows []row
	for _, phase := range []string{"steady", "churn"} {
		before, err := w.Metric("steelyard_ingress_nginx_reloads_total")
		if err != nil {
			return nil, err
		}
		logf("%s %s: %d requests/s for %v", mode, phase, rate, duration)
		done := make(chan struct{})
		churnDone := make(chan error, 1)
		changes := &changeLog{}
		if phase == "churn" {
			go func() { churnDone <- churn(w, pods, period, done, changes) }()
		} else {
			churnDone <- nil
		}
		r := load(client, rate, duration, timeout)
		close(done)
		if err := <-churnDone; err != nil {
			return nil, err
		}
		r.slow, r.slowNear = r.slowAfter(changes.times(), 50*time.Millisecond, time.Second)
		logf("%s %s: %d requests took >= 50ms; %d of them were due within 1s after one of the %d endpoint changes", mode, phase, r.slow, r.slowNear, len(changes.times()))
		time.Sleep(500 * time.Millisecond)
		after, err := w.Metric("steelyard_ingress_nginx_reloads_total")
		if err != nil {
			return nil, err
		}
		r.mode, r.phase, r.reloads, r.loadavg = mode, phase, int(after-before), loadAvg()
		logf("%s %s: %d requests, %d errors %v, %d reloads, p99.9 %s", mode, phase, r.requests, r.errors, r.errClasses, r.reloads, ms(r.p999))
		rows = append(rows, r)
		if phase == "churn" {
			// Back to 5 for a clean state (churn ends on either).
			_ = w.SetEndpoints(ctx, "bench", pods[:5]...)
		}
	}
	return rows, nil
}

// changeLog records when each endpoint change was written.
type changeLog struct {
	mu sync.Mutex
	at []time.Time
}

func (c *changeLog) add(t time.Time) {
	c.mu.Lock()
	c.at = append(c.at, t)
	c.mu.Unlock()
}

func (c *changeLog) times() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.at...)
}

// slowNear says how many requests took at least slow, and how many of
// those were due within window after an endpoint change: a diagnosis of
// where a tail comes from.
func (r row) slowAfter(changes []time.Time, slow, window time.Duration) (n, near int) {
	for i, l := range r.lat {
		if l < slow {
			continue
		}
		n++
		for _, c := range changes {
			if d := r.due[i].Sub(c); d >= 0 && d < window {
				near++
				break
			}
		}
	}
	return n, near
}

// churn toggles the endpoints between 5 and 7 every period until done.
func churn(w *harness.World, pods []string, period time.Duration, done <-chan struct{}, log *changeLog) error {
	n := 5
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-t.C:
		}
		if n == 5 {
			n = 7
		} else {
			n = 5
		}
		log.add(time.Now())
		if err := w.SetEndpoints(context.Background(), "bench", pods[:n]...); err != nil {
			return err
		}
	}
}

// load sends rate requests a second for d, open loop, and summarises them.
func load(client *http.Client, rate int, d, timeout time.Duration) row {
	interval := time.Second / time.Duration(rate)
	total := int(d / interval)
	lat := make([]time.Duration, total)
	dues := make([]time.Time, total)
	errs := make([]string, total)
	var wg sync.WaitGroup
	start := time.Now().Add(10 * time.Millisecond)
	for i := 0; i < total; i++ {
		due := start.Add(time.Duration(i) * interval)
		dues[i] = due
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(i int, due time.Time) {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), due.Add(timeout))
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://bench.example/", nil)
			resp, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			lat[i] = time.Since(due)
			if err != nil {
				c := harness.ErrClass(err)
				if strings.HasPrefix(err.Error(), "status ") {
					c = err.Error()
				}
				errs[i] = c
			}
		}(i, due)
	}
	wg.Wait()
	r := row{requests: total, errClasses: map[string]int{}, due: dues, lat: append([]time.Duration(nil), lat...)}
	for _, e := range errs {
		if e != "" {
			r.errors++
			r.errClasses[e]++
			if e == "timeout" {
				r.timeouts++
			}
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		k := int(p*float64(len(lat))+0.999999) - 1
		return lat[max(0, min(k, len(lat)-1))]
	}
	r.p50, r.p99, r.p999 = pct(0.50), pct(0.99), pct(0.999)
	if len(lat) > 0 {
		r.max = lat[len(lat)-1]
	}
	return r
}
