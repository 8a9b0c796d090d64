package main

// The load generator: open-loop, constant-rate HTTP requests to nginx and
// their latency percentiles and series.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/steelyard-net/steelyard/test/bench/node/result"
)

// loadResult is every request of one load: due time, latency (from the due
// time) and error class ("" if it succeeded).
type loadResult struct {
	due    []time.Time
	lat    []time.Duration
	errs   []string
	behind time.Duration
}

func (l *loadResult) errors() int {
	n := 0
	for _, e := range l.errs {
		if e != "" {
			n++
		}
	}
	return n
}

func (l *loadResult) classes() map[string]int {
	m := map[string]int{}
	for _, e := range l.errs {
		if e != "" {
			m[e]++
		}
	}
	return m
}

type percentiles struct{ P50, P99, P999, Max float64 }

func pct(lat []time.Duration) percentiles {
	if len(lat) == 0 {
		return percentiles{}
	}
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(p float64) float64 {
		k := int(p*float64(len(s))+0.999999) - 1
		return ms(s[max(0, min(k, len(s)-1))])
	}
	return percentiles{at(0.50), at(0.99), at(0.999), ms(s[len(s)-1])}
}

func (l *loadResult) summary() percentiles { return pct(l.lat) }

// series cuts the requests into buckets by due time.
func (l *loadResult) series(start time.Time, d time.Duration, cpu []float64) []result.Point {
	n := int(d / bucket)
	lats := make([][]time.Duration, n)
	errs := make([]int, n)
	for i, due := range l.due {
		k := int(due.Sub(start) / bucket)
		if k < 0 || k >= n {
			continue
		}
		lats[k] = append(lats[k], l.lat[i])
		if l.errs[i] != "" {
			errs[k]++
		}
	}
	var pts []result.Point
	for k := range n {
		p := pct(lats[k])
		pt := result.Point{T: (time.Duration(k) * bucket).Seconds(), N: len(lats[k]), Errors: errs[k], P50: p.P50, P99: p.P99, Max: p.Max}
		if k < len(cpu) {
			pt.CPU = cpu[k]
		}
		pts = append(pts, pt)
	}
	return pts
}

func (b *bench) load(rate int, d time.Duration) *loadResult {
	return b.loadFrom(time.Now(), rate, d)
}

// loadFrom sends rate requests a second for d from start, open loop:
// request i is due at start + i/rate whatever happened to earlier ones, and
// its latency counts from that due time (no coordinated omission).
func (b *bench) loadFrom(start time.Time, rate int, d time.Duration) *loadResult {
	interval := time.Second / time.Duration(rate)
	total := int(d / interval)
	l := &loadResult{due: make([]time.Time, total), lat: make([]time.Duration, total), errs: make([]string, total)}
	var wg sync.WaitGroup
	start = start.Add(10 * time.Millisecond)
	for i := range total {
		due := start.Add(time.Duration(i) * interval)
		l.due[i] = due
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		} else if -wait > l.behind {
			l.behind = -wait
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), due.Add(b.timeout))
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://bench.example/hostname", nil)
			resp, err := b.http.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			l.lat[i] = time.Since(due)
			if err != nil {
				l.errs[i] = errClass(err)
			}
		}()
	}
	wg.Wait()
	return l
}

// errClass names an error briefly: "timeout", "reset", "refused", "status
// 502", ...
func errClass(err error) string {
	s := err.Error()
	switch {
	case strings.HasPrefix(s, "status "):
		return s
	case strings.Contains(s, "deadline exceeded"), strings.Contains(s, "Timeout"), strings.Contains(s, "timeout"):
		return "timeout"
	case strings.Contains(s, "reset"):
		return "reset"
	case strings.Contains(s, "refused"):
		return "refused"
	case strings.Contains(s, "EOF"):
		return "EOF"
	}
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}
