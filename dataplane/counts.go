package dataplane

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"sort"
)

// EndpointCount is how many new connections the kernel sent to one endpoint
// of a Service port, as counted in the kernel (issue 23): the first packet
// of each connection (conntrack NEW) bumps it once, whichever entry point
// (clusterIP, node port, external or load-balancer IP) it came through.
// Each dataplane counts where it chooses the endpoint: iptables an nfacct
// object named in the endpoint's DNAT rule, nftables a counter on the
// endpoint's element of the weight map, IPVS the real server's InConns.
type EndpointCount struct {
	// Service is "namespace/name:port", as ServiceView.Service.
	Service  string         `json:"service"`
	Protocol Protocol       `json:"protocol"`
	Endpoint netip.AddrPort `json:"endpoint"`
	// NewConnections is the count since the counter was made (see
	// docs/operations.md for what resets it in each mode).
	NewConnections uint64 `json:"newConnections"`
}

// countKey identifies one counter.
type countKey struct {
	service  string
	protocol Protocol
	endpoint netip.AddrPort
}

func (c EndpointCount) key() countKey { return countKey{c.Service, c.Protocol, c.Endpoint} }

// MergeCounts sums counts of the same Service port and endpoint (one
// endpoint reached through two split chains, or two families read apart)
// and sorts them by Service, protocol and endpoint.
func MergeCounts(lists ...[]EndpointCount) []EndpointCount {
	sum := map[countKey]uint64{}
	for _, l := range lists {
		for _, c := range l {
			sum[c.key()] += c.NewConnections
		}
	}
	out := make([]EndpointCount, 0, len(sum))
	for k, n := range sum {
		out = append(out, EndpointCount{Service: k.service, Protocol: k.protocol, Endpoint: k.endpoint, NewConnections: n})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Service != b.Service {
			return a.Service < b.Service
		}
		if a.Protocol != b.Protocol {
			return a.Protocol < b.Protocol
		}
		return a.Endpoint.Compare(b.Endpoint) < 0
	})
	return out
}

// SubtractCounts returns now minus before per counter: the connections
// counted between two reads. A counter that went down (its endpoint was
// removed and came back) counts from zero.
func SubtractCounts(now, before []EndpointCount) []EndpointCount {
	old := map[countKey]uint64{}
	for _, c := range before {
		old[c.key()] = c.NewConnections
	}
	out := make([]EndpointCount, 0, len(now))
	for _, c := range now {
		if o, ok := old[c.key()]; ok && o <= c.NewConnections {
			c.NewConnections -= o
		}
		out = append(out, c)
	}
	return out
}

// DivergeSigmas is how many standard deviations an observed share may be
// from the configured one and still be noise: at 4 a correct split is
// called divergent about once in 16,000 checks of one backend.
const DivergeSigmas = 4

// The verdicts of ObservedView.
const (
	VerdictNoise    = "within expected noise"
	VerdictDiverges = "diverges"
	VerdictNoData   = "no connections counted"
)

// ObservedBackend is one backend's configured and observed share.
type ObservedBackend struct {
	IP   string `json:"ip"`
	Port uint16 `json:"port"`
	// Configured is the share in percent of the connections that reach a
	// backend (the reject share, which no endpoint counts, left out).
	Configured float64 `json:"configured"`
	Count      uint64  `json:"count"`
	Observed   float64 `json:"observed"`
	// Sigmas is (count - n p) / sqrt(n p (1-p)): how far the count is from
	// the configured share in standard deviations of a binomial count.
	Sigmas float64 `json:"sigmas"`
}

// ObservedView is a VIP's configured against observed split.
type ObservedView struct {
	Service  string            `json:"service"`
	VIP      string            `json:"vip"`
	Port     uint16            `json:"port"`
	Protocol Protocol          `json:"protocol"`
	Total    uint64            `json:"total"`
	Verdict  string            `json:"verdict"`
	Backends []ObservedBackend `json:"backends"`
	// Unexpected counts connections to endpoints the VIP no longer has
	// (counted before a change, kept while the counter lives).
	Unexpected uint64 `json:"unexpected,omitempty"`
}

// Observe sets each clusterIP view beside the counts of its Service port.
// The counts of a port sum all its entry points; the clusterIP's split is
// the configured one compared (node ports with a Local policy split over
// this node's endpoints only: their connections are in the same counters).
// A VIP diverges when any backend is more than DivergeSigmas standard
// deviations from its configured share, or when a backend configured for
// no connection got some.
func Observe(views []ServiceView, counts []EndpointCount) []ObservedView {
	byPort := map[[2]string]map[netip.AddrPort]uint64{}
	for _, c := range counts {
		k := [2]string{c.Service, string(c.Protocol)}
		if byPort[k] == nil {
			byPort[k] = map[netip.AddrPort]uint64{}
		}
		byPort[k][c.Endpoint] += c.NewConnections
	}
	var out []ObservedView
	for _, v := range views {
		if entryOf(v) != EntryClusterIP || v.Reject {
			continue
		}
		got := byPort[[2]string{v.Service, string(v.Protocol)}]
		ov := ObservedView{Service: v.Service, VIP: v.VIP, Port: v.Port, Protocol: v.Protocol, Backends: []ObservedBackend{}}
		var sum float64
		for _, b := range v.Backends {
			sum += b.Share
		}
		seen := map[netip.AddrPort]bool{}
		for _, b := range v.Backends {
			ob := ObservedBackend{IP: b.IP, Port: b.Port}
			if sum > 0 {
				ob.Configured = RoundShare(100 * b.Share / sum)
			}
			if a, err := netip.ParseAddr(b.IP); err == nil {
				ap := netip.AddrPortFrom(a, b.Port)
				if !seen[ap] {
					ob.Count = got[ap]
				}
				seen[ap] = true
			}
			ov.Total += ob.Count
			ov.Backends = append(ov.Backends, ob)
		}
		for ap, n := range got {
			if !seen[ap] {
				ov.Unexpected += n
			}
		}
		ov.Verdict = VerdictNoData
		if ov.Total > 0 {
			ov.Verdict = VerdictNoise
		}
		n := float64(ov.Total)
		for i := range ov.Backends {
			b := &ov.Backends[i]
			if ov.Total == 0 {
				continue
			}
			b.Observed = RoundShare(100 * float64(b.Count) / n)
			b.Sigmas = sigmas(b.Count, n, b.Configured/100)
			if math.Abs(b.Sigmas) > DivergeSigmas {
				ov.Verdict = VerdictDiverges
			}
		}
		out = append(out, ov)
	}
	return out
}

// sigmas is the binomial z score of k successes in n trials of chance p.
// p of 0 or 1 has no spread: any other count is infinitely far.
func sigmas(k uint64, n, p float64) float64 {
	d := float64(k) - n*p
	sd := math.Sqrt(n * p * (1 - p))
	if sd == 0 {
		switch {
		case math.Abs(d) < 0.5:
			return 0
		case d > 0:
			return math.Inf(1)
		}
		return math.Inf(-1)
	}
	return math.Round(d/sd*100) / 100
}

// WriteObserved prints observed views as text or json. Text: one line per
// VIP with its count and verdict, then one line per backend with the
// configured and the observed share.
func WriteObserved(w io.Writer, views []ObservedView, format string) error {
	switch format {
	case "json":
		if views == nil {
			views = []ObservedView{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	case "", "text":
		for _, v := range views {
			line := fmt.Sprintf("%s %s -> %d new connections: %s", v.Service, netip.AddrPortFrom(netip.MustParseAddr(v.VIP), v.Port).String()+"/"+string(v.Protocol), v.Total, v.Verdict)
			if v.Unexpected > 0 {
				line += fmt.Sprintf(" (%d more to endpoints it no longer has)", v.Unexpected)
			}
			if _, err := fmt.Fprintln(w, line); err != nil {
				return err
			}
			for _, b := range v.Backends {
				ep := netip.AddrPortFrom(netip.MustParseAddr(b.IP), b.Port).String()
				l := fmt.Sprintf("    %-24s configured %7.3f%%  observed %7.3f%%  %8d", ep, b.Configured, b.Observed, b.Count)
				if v.Total > 0 {
					l += fmt.Sprintf("  %+.2f sigma", b.Sigmas)
				}
				if _, err := fmt.Fprintln(w, l); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return fmt.Errorf("unknown output format %q (want text or json)", format)
}
