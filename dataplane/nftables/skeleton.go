package nftables

import "sigs.k8s.io/knftables"

// skeleton adds (and flushes and refills) the fixed chains and sets. The
// shared maps are only added: their elements belong to the Service ports.
func (p *Proxier) skeleton(tx txn) {
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("steelyard: weighted Service VIPs")})
	ip := p.f.ip
	tx.Add(&knftables.Map{Name: mapServiceIPs, Type: p.f.addrType + " . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapServiceNodePorts, Type: "inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapNoEndpointServices, Type: p.f.addrType + " . inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Map{Name: mapNoEndpointNodePorts, Type: "inet_proto . inet_service : verdict"})
	tx.Add(&knftables.Set{Name: setNodePortIPs, Type: p.f.addrType})
	tx.Add(&knftables.Set{Name: setHairpin, Type: p.f.addrType + " . inet_proto . inet_service . " + p.f.addrType})
	tx.Add(&knftables.Set{Name: setClusterCIDRs, Type: p.f.addrType, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
	tx.Flush(&knftables.Set{Name: setClusterCIDRs})
	for _, c := range p.familyCIDRs() {
		tx.Add(&knftables.Element{Set: setClusterCIDRs, Key: []string{c}})
	}
	mark := p.cfg.markBit()
	tcp := l4proto(protoNumbers["tcp"])
	vmapPorts := func(m string) nftOnly { return nftOnly("meta l4proto . th dport vmap @" + m) }
	vmapAddrPorts := func(m string) nftOnly { return nftOnly(ip + " daddr . meta l4proto . th dport vmap @" + m) }
	nodePortIPs := inSet{field: daddr, set: setNodePortIPs}
	regular := []struct {
		name  string
		rules []rule
	}{
		{chainMarkMasq, []rule{r(markSet{mark: mark})}},
		{chainMasquerading, []rule{p.hairpinRule(),
			r(nftOnly("meta mark & "+p.cfg.mark()+" == 0"), vReturn),
			r(markSet{xor: true, mark: mark}),
			r(masquerade{})}},
		{chainReject, []rule{r(nftOnly("reject"))}},
		{chainRejectShare, []rule{r(tcp, nftOnly("reject with tcp reset")), r(nftOnly("reject"))}},
		{chainFilterEndpoints, []rule{
			r(vmapAddrPorts(mapNoEndpointServices)),
			r(nodePortIPs, vmapPorts(mapNoEndpointNodePorts)),
		}},
		{chainServices, []rule{
			r(vmapAddrPorts(mapServiceIPs)),
			r(nodePortIPs, vmapPorts(mapServiceNodePorts)),
		}},
	}
	for _, c := range regular {
		tx.Add(&knftables.Chain{Name: c.name})
		tx.Flush(&knftables.Chain{Name: c.name})
		for _, rl := range c.rules {
			tx.AddRule(c.name, nil, rl)
		}
	}
	ctNew := nftOnly("ct state new")
	bases := []struct {
		name string
		typ  knftables.BaseChainType
		hook knftables.BaseChainHook
		prio knftables.BaseChainPriority
		rule rule
	}{
		{chainNATPrerouting, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority, r(jump(chainServices))},
		{chainNATOutput, knftables.NATType, knftables.OutputHook, knftables.DNATPriority, r(jump(chainServices))},
		{chainNATPostrouting, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority, r(jump(chainMasquerading))},
		{chainFilterInput, knftables.FilterType, knftables.InputHook, knftables.FilterPriority, r(ctNew, jump(chainFilterEndpoints))},
		{chainFilterForward, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority, r(ctNew, jump(chainFilterEndpoints))},
		{chainFilterOutput, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority, r(ctNew, jump(chainFilterEndpoints))},
	}
	for _, b := range bases {
		tx.Add(&knftables.Chain{Name: b.name, Type: knftables.PtrTo(b.typ), Hook: knftables.PtrTo(b.hook), Priority: knftables.PtrTo(b.prio)})
		tx.Flush(&knftables.Chain{Name: b.name})
		tx.AddRule(b.name, nil, b.rule)
	}
	// Forwarded packets conntrack calls invalid (an out-of-window TCP
	// segment) skip the reverse NAT: a pod behind a VIP would reach its
	// client from its own address and be reset (kubernetes#74839, the
	// conformance spec "proxy implementation should not be vulnerable to
	// the invalid conntrack state bug"). kube-proxy's iptables mode drops
	// them the same way.
	tx.AddRule(chainFilterForward, knftables.PtrTo("drop invalid conntrack state (kubernetes#74839)"),
		r(nftOnly("ct state invalid"), vDrop))
	p.localhost(tx)
}
