package controller

import (
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"
)

// Metrics are the agent's Prometheus metrics. Names follow kube-proxy's
// (pkg/proxy/metrics) under a steelyard_ prefix, so dashboards carry over.
type Metrics struct {
	Registry *prometheus.Registry

	SyncDuration        prometheus.Histogram
	FullSyncDuration    prometheus.Histogram
	PartialSyncDuration prometheus.Histogram
	// NetworkProgramming is the time from an endpoint change (the
	// EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time) to
	// the end of the sync that put it in the kernel.
	NetworkProgramming  prometheus.Histogram
	SyncFailures        prometheus.Counter
	LastSyncTimestamp   prometheus.Gauge
	ProgrammedServices  prometheus.Gauge
	ProgrammedEndpoints prometheus.Gauge
	InvalidAnnotations  prometheus.Gauge

	// endpoints, when WatchEndpoints was called, gets each synced State.
	endpoints *endpointCollector
}

// syncBuckets spans 1 ms to about 16 s, like kube-proxy's.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// NewMetrics registers every metric in a new registry (with the Go and
// process collectors).
func NewMetrics() *Metrics {
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "steelyard", Name: name, Help: help, Buckets: buckets})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "steelyard", Name: name, Help: help})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "steelyard", Name: name, Help: help})
	}
	m := &Metrics{
		Registry:            prometheus.NewRegistry(),
		SyncDuration:        hist("sync_proxy_rules_duration_seconds", "Duration of a sync (full or partial), in seconds.", syncBuckets),
		FullSyncDuration:    hist("sync_full_proxy_rules_duration_seconds", "Duration of a full sync, in seconds.", syncBuckets),
		PartialSyncDuration: hist("sync_partial_proxy_rules_duration_seconds", "Duration of a partial sync, in seconds.", syncBuckets),
		NetworkProgramming: hist("network_programming_duration_seconds",
			"Time from an endpoint change (the EndpointSlice's last-change-trigger-time) to the end of the sync that programmed it.",
			prometheus.ExponentialBuckets(0.001, 2, 20)),
		SyncFailures:        counter("sync_proxy_rules_failures_total", "Syncs that failed (the kernel kept its previous rules)."),
		LastSyncTimestamp:   gauge("sync_proxy_rules_last_timestamp_seconds", "Unix time of the last successful sync."),
		ProgrammedServices:  gauge("programmed_services", "Service ports (VIPs) in the kernel after the last successful sync."),
		ProgrammedEndpoints: gauge("programmed_endpoints", "Backends receiving new connections after the last successful sync."),
		InvalidAnnotations:  gauge("invalid_input", "Objects whose bad input (annotation, missing clusterIP, ...) is being ignored."),
	}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.SyncDuration, m.FullSyncDuration, m.PartialSyncDuration, m.NetworkProgramming,
		m.SyncFailures, m.LastSyncTimestamp, m.ProgrammedServices, m.ProgrammedEndpoints, m.InvalidAnnotations)
	return m
}

// WatchTracker exports the tracker's pending and total changes, read at
// scrape time.
func (m *Metrics) WatchTracker(t *ChangeTracker) {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "steelyard", Name: name, Help: help}
	}
	counterOpts := func(name, help string) prometheus.CounterOpts {
		return prometheus.CounterOpts{Namespace: "steelyard", Name: name, Help: help}
	}
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(opts("sync_proxy_rules_service_changes_pending", "Services with changes waiting for a sync."),
			func() float64 { s, _ := t.Pending(); return float64(s) }),
		prometheus.NewGaugeFunc(opts("sync_proxy_rules_endpoint_changes_pending", "EndpointSlices with changes waiting for a sync."),
			func() float64 { _, e := t.Pending(); return float64(e) }),
		prometheus.NewCounterFunc(counterOpts("sync_proxy_rules_service_changes_total", "Service events seen."),
			func() float64 { s, _ := t.Total(); return float64(s) }),
		prometheus.NewCounterFunc(counterOpts("sync_proxy_rules_endpoint_changes_total", "EndpointSlice events seen."),
			func() float64 { _, e := t.Total(); return float64(e) }),
	)
}

// WatchAPIServer exports whether the API server answers the watches and
// its outages, read at scrape time.
func (m *Metrics) WatchAPIServer(h *APIHealth) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "steelyard", Name: "apiserver_reachable",
			Help: "1 when the latest list or watch request of every resource succeeded, else 0."},
			func() float64 {
				if h.Reachable() {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "steelyard", Name: "apiserver_outages_total",
			Help: "API server outages that have ended (every watch re-established)."},
			func() float64 { n, _ := h.Outages(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "steelyard", Name: "apiserver_last_outage_seconds",
			Help: "Length of the last API server outage that has ended, from the first failed request to the last watch re-established."},
			func() float64 { _, d := h.Outages(); return d.Seconds() }),
	)
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// Health answers /healthz and /readyz. Ready after the first successful
// sync; healthy while syncs keep succeeding (a sync succeeds at least every
// sync period, so a last success older than Timeout means the agent is
// stuck or failing).
type Health struct {
	Timeout time.Duration
	Clock   clock.Clock

	mu          sync.Mutex
	started     time.Time
	lastSuccess time.Time
	ready       chan struct{} // closed by the first successful sync
}

// NewHealth returns a Health that considers the agent stale after timeout
// without a successful sync.
func NewHealth(timeout time.Duration, clk clock.Clock) *Health {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Health{Timeout: timeout, Clock: clk, started: clk.Now(), ready: make(chan struct{})}
}

// Synced records a successful sync.
func (h *Health) Synced() {
	h.mu.Lock()
	if h.lastSuccess.IsZero() && h.ready != nil {
		close(h.ready)
	}
	h.lastSuccess = h.Clock.Now()
	h.mu.Unlock()
}

// ReadyC is closed once the first sync has succeeded.
func (h *Health) ReadyC() <-chan struct{} { return h.ready }

// Healthy reports whether syncs are succeeding, and since when the last one did.
func (h *Health) Healthy() (bool, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ref := h.lastSuccess
	if ref.IsZero() {
		ref = h.started
	}
	return h.Clock.Since(ref) <= h.Timeout, h.lastSuccess
}

// Ready reports whether the first sync has succeeded.
func (h *Health) Ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.lastSuccess.IsZero()
}

// Handler serves /healthz and /readyz.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		ok, last := h.Healthy()
		w.Header().Set("Content-Type", "text/plain")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("stale: last successful sync " + formatTime(last) + "\n"))
			return
		}
		_, _ = w.Write([]byte("ok: last successful sync " + formatTime(last) + "\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: no successful sync yet\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339Nano)
}
