package controller

import (
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// EndpointCounts reads the kernel's new connections per endpoint: the
// Counts of a dataplane opened for reading only, so a scrape never shares
// state with the agent's writer.
type EndpointCounts func() ([]dataplane.EndpointCount, error)

// The per-endpoint metrics (issue 23): the kernel's count, and beside it
// what the last sync configured, so a dashboard or an alert compares the
// observed split (rate of the count over its Service port's) with the
// configured ratio (docs/operations.md).
const (
	endpointConnsMetric  = "steelyard_endpoint_new_connections_total"
	endpointWeightMetric = "steelyard_endpoint_weight"
	endpointRatioMetric  = "steelyard_endpoint_configured_ratio"
)

var endpointLabels = []string{"namespace", "service", "port", "endpoint"}

// configuredEndpoint is an endpoint's weight and its share of its Service
// port's cluster-wide split (0 to 1; a reject share left out, as no
// endpoint counts refused connections).
type configuredEndpoint struct {
	weight, ratio float64
}

type endpointKey struct {
	port     dataplane.ServicePortName
	endpoint netip.AddrPort
}

// endpointCollector reads the counts at scrape time; the configured side
// is set after each sync.
type endpointCollector struct {
	read                 EndpointCounts
	conns, weight, ratio *prometheus.Desc
	mu                   sync.Mutex
	configured           map[endpointKey]configuredEndpoint
	// names maps the names a kernel comment may carry (the full one and
	// its ShortName forms, dataplane/comment.go) to the Service port, so a
	// long Gateway route's count is labelled with its real name.
	names map[string]dataplane.ServicePortName
}

// WatchEndpoints exports the kernel's count of new connections per
// endpoint, read at scrape time, with each endpoint's configured weight
// and ratio from the last sync (Agent.observe sets them).
func (m *Metrics) WatchEndpoints(read EndpointCounts) {
	c := &endpointCollector{
		read:   read,
		conns:  prometheus.NewDesc(endpointConnsMetric, "New connections the kernel sent to this endpoint of the Service port (first packets, counted in the kernel; see docs/operations.md for what resets the count).", endpointLabels, nil),
		weight: prometheus.NewDesc(endpointWeightMetric, "The endpoint's configured weight in its Service port's split, as of the last sync.", endpointLabels, nil),
		ratio:  prometheus.NewDesc(endpointRatioMetric, "The endpoint's configured share (0-1) of the new connections of its Service port that reach an endpoint, as of the last sync.", endpointLabels, nil),
	}
	m.endpoints = c
	m.Registry.MustRegister(c)
}

// setState records the configured side of s: its cluster-wide split (the
// one the clusterIP serves).
func (c *endpointCollector) setState(s dataplane.State) {
	conf := make(map[endpointKey]configuredEndpoint, len(c.configured))
	names := make(map[string]dataplane.ServicePortName, len(c.names))
	for i := range s.Services {
		sp := &s.Services[i]
		full := sp.Name.String()
		for _, max := range []int{dataplane.NftCommentMax, dataplane.XtCommentMax} {
			if short := dataplane.ShortName(full, max); short != full {
				names[short] = sp.Name
			}
		}
		bs := sp.ClusterBackends()
		if len(bs) == 0 {
			bs = sp.Active()
		}
		total := dataplane.SumWeights(bs)
		for _, b := range bs {
			e := configuredEndpoint{weight: b.Weight}
			if total > 0 {
				e.ratio = b.Weight / total
			}
			conf[endpointKey{sp.Name, b.Addr()}] = e
		}
	}
	c.mu.Lock()
	c.configured = conf
	c.names = names
	c.mu.Unlock()
}

func (c *endpointCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.weight
	ch <- c.ratio
}

func (c *endpointCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	conf, names := c.configured, c.names
	c.mu.Unlock()
	for k, e := range conf {
		l := []string{k.port.Namespace, k.port.Name, k.port.Port, k.endpoint.String()}
		ch <- prometheus.MustNewConstMetric(c.weight, prometheus.GaugeValue, e.weight, l...)
		ch <- prometheus.MustNewConstMetric(c.ratio, prometheus.GaugeValue, e.ratio, l...)
	}
	counts, err := c.read()
	if err != nil {
		log.WithError(err).Warn("cannot read the endpoints' connection counts")
		return
	}
	for _, n := range counts {
		p, ok := names[n.Service]
		if !ok {
			var err error
			if p, err = dataplane.ParseServicePortName(n.Service); err != nil {
				continue // a comment not of ours
			}
		}
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(n.NewConnections), p.Namespace, p.Name, p.Port, n.Endpoint.String())
	}
}
