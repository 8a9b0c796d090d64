package controller

import (
	"fmt"
	"net/http"

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
