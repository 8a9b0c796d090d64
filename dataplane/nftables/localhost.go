package nftables

import "sigs.k8s.io/knftables"

// Localhost node ports, as the iptables dataplane has them (see
// dataplane/iptables/localhost.go for why each piece): IPv4 only; the
// services and filter-endpoints chains also look up node ports for
// 127.0.0.0/8 from 127.0.0.0/8, the ext- chains' "fib saddr type local"
// masquerade covers a loopback source, and the localnet-input base chain
// drops packets to 127.0.0.0/8 from elsewhere that are not replies or
// DNAT, the mitigation of CVE-2020-8558 that route_localnet=1 needs.
// kube-proxy's own nftables mode has no localhost node ports.

// chainLocalnetInput is the base chain (filter, input) of the martian drop.
const chainLocalnetInput = "localnet-input"

// localhostOn reports whether this Proxier serves localhost node ports.
func (p *Proxier) localhostOn() bool { return p.cfg.LocalhostNodePorts && p.cfg.Family != 6 }

// localhost adds the localhost node port rules to a transaction that has
// just rewritten the fixed chains (skeleton): the node port lookups go
// after the ones for the node's addresses. Off, it deletes the base chain
// an earlier run may have left (add then delete: nft 1.0.6 has no
// "destroy").
func (p *Proxier) localhost(tx txn) {
	base := &knftables.Chain{Name: chainLocalnetInput, Type: knftables.PtrTo(knftables.FilterType),
		Hook: knftables.PtrTo(knftables.InputHook), Priority: knftables.PtrTo(knftables.FilterPriority)}
	tx.Add(base)
	if !p.localhostOn() {
		tx.Flush(&knftables.Chain{Name: chainLocalnetInput}) // older kernels delete only empty chains
		tx.Delete(&knftables.Chain{Name: chainLocalnetInput})
		return
	}
	lo := nftOnly("ip saddr 127.0.0.0/8 ip daddr 127.0.0.0/8")
	tx.AddRule(chainServices, nil, r(lo, nftOnly("meta l4proto . th dport vmap @"+mapServiceNodePorts)))
	tx.AddRule(chainFilterEndpoints, nil, r(lo, nftOnly("meta l4proto . th dport vmap @"+mapNoEndpointNodePorts)))
	tx.Flush(&knftables.Chain{Name: chainLocalnetInput})
	tx.AddRule(chainLocalnetInput, knftables.PtrTo("block incoming localnet connections"),
		r(nftOnly("ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state != { established, related } ct status & dnat == 0"), vDrop))
}
