// Package cni tests steelyard-cni and the agent's stale-UDP-flow cleanup
// against the real kernel, in network namespaces made by test/sandbox:
//
//   - the agent path: a client sends a datagram to a UDP VIP every 100 ms
//     from one socket; the endpoint it reached leaves the Service; within
//     1 s its datagrams reach another endpoint, `conntrack -L` shows no
//     entry from the VIP to the removed endpoint, and unrelated flows (the
//     same pod behind another VIP, the pod reached directly) keep their
//     entries; an agent restart deletes no live flow; the same through a
//     node port on the node's address and through an external IP (the
//     flows move within 1 s, flows to the pod through another node port
//     and directly keep their entries), also when the endpoint left while
//     the agent was down (the first sync finds the stale node-port entry);
//     a flow sent to a port before it became a node port (untranslated,
//     refused by the node) reaches a pod within 1 s of the node port
//     opening, while an untranslated flow to another port keeps its entry;
//   - the real chain: the reference bridge and host-local plugins
//     (containernetworking/plugins, built through the module proxy by
//     scripts/cni-plugins.sh) then steelyard-cni, run through libcni for
//     every supported spec version: after ADD the pod's bridge port has
//     hairpin mode and the pod reaches itself through a VIP; CHECK passes;
//     DEL of a pod deletes the conntrack entries pointing at it (a client's
//     flow moves to another endpoint within 1 s); DEL twice succeeds.
//
// Every plugin runs inside the sandbox's node namespace (`ip netns exec`),
// so the bridge, its veths and the IPAM state never touch the machine's own
// namespace; host-local keeps its state in a temporary folder.
//
// The tests carry the build tag cni and need root; they fail (never skip)
// without it:
//
//	sudo go test -tags cni ./test/cni/ -v
//
// TestMain builds cmd/steelyard (or uses $STEELYARD_BIN) and
// cmd/steelyard-cni, and takes the reference plugins from
// $CNI_PLUGINS_DIR, else runs scripts/cni-plugins.sh (cached).
//
// Test IP plan (on top of the sandbox's, see test/sandbox):
//
//	198.18.0.13:53   UDP  dns    198.19.4.2 dns-1, 198.19.4.3 dns-2 (port 5353)
//	198.18.0.16:123  UDP  other  the removed endpoint, behind another VIP
//	198.19.0.1:30053 UDP  dns's node port (NodePort tests), on the node
//	198.18.1.13:53   UDP  dns's external IP (NodePort tests)
//	198.19.0.1:30054 UDP  other's node port, or a port that is none
//	198.18.0.20:80   TCP  self   the chain's pod a (hairpin)
//	198.18.0.21:53   UDP  echo   the chain's pods b and c (port 5353)
//	198.19.64.0/24   the chain's bridge syb0: gateway .1, pods from .2 (host-local)
//	198.19.254.2     the client
package cni
