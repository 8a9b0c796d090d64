package controller

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/steelyard-net/steelyard/dataplane"
)

// categorize decides which endpoints of one Service port receive new
// connections, separately for the two categories a dataplane uses, as
// kube-proxy's CategorizeEndpoints (pkg/proxy/topology.go) does:
//
//   - cluster endpoints (ServicePort.ClusterBackends, traffic policy
//     Cluster): the ready endpoints that topology keeps (see topologyOf);
//     when there is none, every serving-and-terminating endpoint, topology
//     ignored (kube-proxy only falls back when nothing is ready anywhere, so
//     there is no topology left to honour);
//   - local endpoints (ServicePort.LocalBackends, traffic policy Local): the
//     ready endpoints on this node; when there is none, the
//     serving-and-terminating ones on this node, whatever the rest of the
//     cluster has. Topology does not apply.
//
// The fallback is decided per category: a Local port whose only local
// endpoint is terminating keeps using it while other nodes have ready ones,
// instead of dropping the connections (issue 20).
//
// "Ready" and "serving" here also need a positive weight: an endpoint
// weighted 0 (drained) is treated as one that cannot take new connections,
// so draining every ready endpoint falls back to the serving-and-terminating
// ones like a rollout does. This also keeps the invariant the dataplanes
// rely on: when a port has a local endpoint, it has a cluster endpoint.
//
// The result is written into bs: Weight becomes 0 for an endpoint in
// neither category; LocalOnly marks one in the local category only (topology
// keeps cluster traffic away from it, or it is terminating while ready
// endpoints exist elsewhere). hints[i] are the zone hints of bs[i].
func (bd *build) categorize(si *serviceInfo, bs []dataplane.Backend, hints [][]string) {
	inTopology := bd.topologyOf(si, bs, hints)
	cluster := make([]bool, len(bs))
	anyCluster := false
	for i, b := range bs {
		if isReady(b) && (inTopology == nil || inTopology[i]) {
			cluster[i], anyCluster = true, true
		}
	}
	if !anyCluster {
		for i, b := range bs {
			cluster[i] = isServingTerminating(b)
		}
	}
	local := make([]bool, len(bs))
	anyLocalReady := false
	for i, b := range bs {
		if b.Local && isReady(b) {
			local[i], anyLocalReady = true, true
		}
	}
	if !anyLocalReady {
		for i, b := range bs {
			local[i] = b.Local && isServingTerminating(b)
		}
	}
	for i := range bs {
		bs[i].LocalOnly = local[i] && !cluster[i]
		if !cluster[i] && !local[i] {
			// Stays in the state so established connections drain.
			bs[i].Weight = 0
		}
	}
}

// isReady: the endpoint may take new connections in the first place.
func isReady(b dataplane.Backend) bool { return b.Ready && b.Weight > 0 }

// isServingTerminating: the endpoint is shutting down but still serving, the
// fallback of a category that has no ready endpoint.
func isServingTerminating(b dataplane.Backend) bool {
	return b.Serving && b.Terminating && b.Weight > 0
}

// topologyOf returns which endpoints topology keeps cluster traffic on, or
// nil when topology is off. As kube-proxy reads it, only ready endpoints
// decide:
//
//   - trafficDistribution PreferSameNode (KEP-3015): this node's ready
//     endpoints when it has one, else as PreferSameZone;
//   - zone hints, when this node has a zone, every ready endpoint carries
//     hints and at least one is hinted for this zone: the endpoints hinted
//     for it. trafficDistribution PreferClose (PreferSameZone) without
//     hints (no EndpointSlice controller filled them, as with manifests)
//     hints each endpoint for its own zone, which is what that controller
//     does.
//
// Weights then apply among the endpoints that remain.
func (bd *build) topologyOf(si *serviceInfo, bs []dataplane.Backend, hints [][]string) []bool {
	var td string
	if si.svc.Spec.TrafficDistribution != nil {
		td = *si.svc.Spec.TrafficDistribution
	}
	if td == corev1.ServiceTrafficDistributionPreferSameNode && bd.b.NodeName != "" {
		in := make([]bool, len(bs))
		anyLocal := false
		for i, b := range bs {
			if isReady(b) && b.Local {
				in[i], anyLocal = true, true
			}
		}
		if anyLocal {
			return in
		}
	}
	zone := bd.b.Zone
	if zone == "" {
		return nil
	}
	preferClose := td == corev1.ServiceTrafficDistributionPreferClose || td == corev1.ServiceTrafficDistributionPreferSameZone ||
		td == corev1.ServiceTrafficDistributionPreferSameNode
	in := make([]bool, len(bs))
	anyInZone := false
	for i, b := range bs {
		if !isReady(b) {
			continue
		}
		h := hints[i]
		if len(h) == 0 && preferClose && b.Zone != "" {
			h = []string{b.Zone}
		}
		if len(h) == 0 {
			// One ready endpoint without hints: topology is off.
			return nil
		}
		if slices.Contains(h, zone) {
			in[i], anyInZone = true, true
		}
	}
	if !anyInZone {
		return nil
	}
	return in
}
