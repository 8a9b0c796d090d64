package ipvs

import "github.com/steelyard-net/steelyard/dataplane"

// Counts implements dataplane.Dataplane: each destination's InConns, the
// connections IPVS scheduled to it, summed over the virtual servers of a
// Service port (its clusterIP, node port on each node address, external
// and load-balancer IPs). IPVS always counts, so this mode needs no
// setting; the count lives as long as the destination (a weight change
// keeps it; graceful removal keeps it until the destination is deleted).
func (p *Proxier) Counts() ([]dataplane.EndpointCount, error) {
	isOurs, names, err := p.ours(nil)
	if err != nil {
		return nil, err
	}
	vss, err := p.ipvs.VirtualServers()
	if err != nil {
		return nil, err
	}
	var out []dataplane.EndpointCount
	for _, vs := range vss {
		sc, named := names[vs.Key()]
		if !isOurs(vs) || !named {
			continue
		}
		name, _ := parseComment(sc.comment)
		rss, err := p.ipvs.RealServers(vs)
		if err != nil {
			return nil, err
		}
		for _, r := range rss {
			out = append(out, dataplane.EndpointCount{Service: name, Protocol: vs.Protocol, Endpoint: r.Addr(), NewConnections: r.InConns})
		}
	}
	return dataplane.MergeCounts(out), nil
}
