package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// scraper reads a proxy's /metrics and health endpoint from inside its
// network namespace: the connection's socket is made in the namespace,
// where the proxy listens on 127.0.0.1.
type scraper struct {
	client *http.Client
	url    string
	prefix string // "steelyard_" or "kubeproxy_"
	health string // URL of the health endpoint that carries the last sync time
	kube   bool   // kube-proxy's /livez (JSON), else steelyard's /healthz (text)
}

func newScraper(n *sandbox.NS, p proxy) *scraper {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := n.Do(func() error {
				var err error
				d := net.Dialer{Timeout: 2 * time.Second}
				c, err = d.DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
		MaxIdleConns: 1,
	}
	s := &scraper{client: &http.Client{Transport: tr, Timeout: 10 * time.Second}, prefix: p.metricsPrefix()}
	if p.steelyard() {
		s.url, s.health = "http://"+steelyardMetrics+"/metrics", "http://"+steelyardHealthz+"/healthz"
	} else {
		s.url, s.health, s.kube = "http://"+kubeProxyMetrics+"/metrics", "http://"+kubeProxyHealthz+"/livez", true
	}
	return s
}

// lastSync returns the end of the proxy's last successful sync, from its
// health endpoint: far cheaper for the proxy to answer than /metrics
// (kube-proxy spends about 5 ms of CPU on each /metrics, steelyard 2 ms),
// so polling it does not show in the CPU column. The zero time when there
// is none yet, or no answer.
//
// steelyard's /healthz says "ok: last successful sync <RFC 3339>";
// kube-proxy's /livez carries status.IPv4.lastUpdated, set at the end of
// each successful IPv4 sync (and once when its sync loop starts, before the
// first sync).
func (s *scraper) lastSync(ctx context.Context) time.Time {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.health, nil)
	if err != nil {
		return time.Time{}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return time.Time{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return time.Time{}
	}
	if s.kube {
		var h struct {
			Status map[string]struct {
				LastUpdated time.Time `json:"lastUpdated"`
			} `json:"status"`
		}
		if json.Unmarshal(body, &h) != nil {
			return time.Time{}
		}
		return h.Status["IPv4"].LastUpdated
	}
	_, after, ok := strings.Cut(strings.TrimSpace(string(body)), "last successful sync ")
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, after)
	if err != nil {
		return time.Time{}
	}
	return t
}

func (s *scraper) close() { s.client.CloseIdleConnections() }

// scrape fetches and parses the metrics.
func (s *scraper) scrape(ctx context.Context) (metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", s.url, resp.Status)
	}
	return parseMetrics(resp.Body, s.prefix)
}

// metrics maps a sample name without the proxy's prefix
// ("sync_proxy_rules_last_timestamp_seconds", "..._bucket") to its
// samples. Only IPv4 samples are kept: kube-proxy runs one proxier per IP
// family and labels its samples ip_family="IPv4"/"IPv6"; steelyard's have
// no such label.
type metrics map[string][]sample

type sample struct {
	labels string // the text between the braces, "" when none
	value  float64
}

func parseMetrics(r io.Reader, prefix string) (metrics, error) {
	m := metrics{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue // comments, other subsystems
		}
		line = line[len(prefix):]
		name, labels, rest := line, "", ""
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			name, labels, rest = line[:i], line[i+1:j], line[j+1:]
		} else if i := strings.IndexByte(line, ' '); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.Contains(labels, `ip_family="IPv6"`) {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		m[name] = append(m[name], sample{labels: labels, value: v})
	}
	return m, sc.Err()
}

// value returns the first sample of name.
func (m metrics) value(name string) (float64, bool) {
	s := m[name]
	if len(s) == 0 {
		return 0, false
	}
	return s[0].value, true
}

// histogram is a Prometheus histogram: cumulative bucket counts by upper
// bound (the last one +Inf), sum and count.
type histogram struct {
	le     []float64
	counts []float64
	sum    float64
	count  float64
}

func (m metrics) histogram(name string) histogram {
	var h histogram
	type b struct{ le, n float64 }
	var bs []b
	for _, s := range m[name+"_bucket"] {
		i := strings.Index(s.labels, `le="`)
		if i < 0 {
			continue
		}
		rest := s.labels[i+4:]
		le, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, '"')], 64)
		if err != nil {
			continue
		}
		bs = append(bs, b{le, s.value})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	for _, x := range bs {
		h.le = append(h.le, x.le)
		h.counts = append(h.counts, x.n)
	}
	h.sum, _ = m.value(name + "_sum")
	h.count, _ = m.value(name + "_count")
	return h
}

// minus returns the observations made between before and h.
func (h histogram) minus(before histogram) histogram {
	d := histogram{le: h.le, counts: make([]float64, len(h.counts)), sum: h.sum - before.sum, count: h.count - before.count}
	for i := range h.counts {
		d.counts[i] = h.counts[i]
		if i < len(before.counts) && before.le[i] == h.le[i] {
			d.counts[i] -= before.counts[i]
		}
	}
	return d
}

// quantile returns the upper bound of the bucket holding quantile q (the
// histogram only knows that much), +Inf past the last finite bucket, NaN
// when empty.
func (h histogram) quantile(q float64) float64 {
	if h.count <= 0 {
		return math.NaN()
	}
	want := math.Ceil(q * h.count)
	for i, n := range h.counts {
		if n >= want {
			return h.le[i]
		}
	}
	return math.Inf(1)
}
