package controller

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// LocalhostAccepted reads the count of accepted localhost node port
// packets; false when the dataplane keeps none (off, IPv6 only, no nfacct,
// a mode that does not count).
type LocalhostAccepted func() (uint64, bool)

// Names of the localhost node port counter: steelyard's, and kube-proxy's
// (pkg/proxy/metrics LocalhostNodePortAcceptedNFAcctCounter's metric).
const (
	localhostAcceptedMetric          = "steelyard_localhost_nodeports_accepted_packets_total"
	kubeProxyLocalhostAcceptedMetric = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
)

// localhostCollector exports the counter under one name, read at scrape
// time from the kernel; nothing when it is not kept.
type localhostCollector struct {
	desc *prometheus.Desc
	read LocalhostAccepted
}

func newLocalhostCollector(name string, read LocalhostAccepted) *localhostCollector {
	return &localhostCollector{
		desc: prometheus.NewDesc(name, "Packets to node ports on 127.0.0.0/8 that were accepted (first packets of new connections), counted in the kernel.", nil, nil),
		read: read,
	}
}

func (c *localhostCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *localhostCollector) Collect(ch chan<- prometheus.Metric) {
	if v, ok := c.read(); ok {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v))
	}
}

// WatchLocalhostNodePorts exports the localhost node port counter as
// steelyard_localhost_nodeports_accepted_packets_total.
func (m *Metrics) WatchLocalhostNodePorts(read LocalhostAccepted) {
	m.Registry.MustRegister(newLocalhostCollector(localhostAcceptedMetric, read))
}

// KubeProxyCompatHandler serves the part of kube-proxy's metrics endpoint
// (kube-proxy's --metrics-bind-address, 127.0.0.1:10249) that tools and
// Kubernetes' e2e tests written against kube-proxy read: /proxyMode (the
// dataplane mode, "iptables", "nftables" or "ipvs": steelyard's real one,
// so a check for kube-proxy's iptables mode holds only in iptables mode)
// and /metrics with kubeproxy_iptables_localhost_nodeports_accepted_packets_total.
// It is off unless asked for (run --kube-proxy-metrics-bind-address): an
// agent beside kube-proxy would take kube-proxy's port.
func KubeProxyCompatHandler(mode string, read LocalhostAccepted) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newLocalhostCollector(kubeProxyLocalhostAcceptedMetric, read))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		fmt.Fprint(w, mode)
	})
	return mux
}

// KubeProxyHealthHandler serves /healthz and /livez in the shape of
// kube-proxy's health server (--healthz-bind-address, 0.0.0.0:10256): a
// JSON object whose "lastUpdated" is the last successful sync and
// "currentTime" the time of the answer, 200 while syncs succeed and 503
// once the last success is older than h's timeout. Load balancers that
// probe nodes at kube-proxy's port, and Kubernetes' e2e test "should check
// kube-proxy urls" (it looks for `"lastUpdated": ` in the body, with the
// space), read it. Off unless asked for (run
// --kube-proxy-healthz-bind-address): the agent's own /healthz keeps its
// port, so the two can run beside kube-proxy during a migration.
func KubeProxyHealthHandler(h *Health) http.Handler {
	answer := func(w http.ResponseWriter, _ *http.Request) {
		ok, last := h.Healthy()
		if last.IsZero() {
			// kube-proxy reports its start time before the first sync.
			last = h.started
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		// Written by hand: encoding/json leaves out the space after the
		// colon that the e2e test matches.
		fmt.Fprintf(w, "{\"lastUpdated\": %q, \"currentTime\": %q}", last.UTC().Format(time.RFC3339Nano), h.Clock.Now().UTC().Format(time.RFC3339Nano))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", answer)
	mux.HandleFunc("/livez", answer)
	return mux
}
