package iptables

import iptk "github.com/steelyard-net/steelyard/internal/iptables"

// Localhost node ports (kube-proxy's iptables.localhostNodePorts, on by
// default there): node ports answer on 127.0.0.0/8 to the node's own
// processes, IPv4 only (IPv6 has no route_localnet). Three pieces, as in
// kube-proxy:
//   - nat STEELYARD-SERVICES sends 127.0.0.0/8 to STEELYARD-NODEPORTS (and
//     filter STEELYARD-SERVICES, so a node port without endpoints is
//     refused there too). Only sources in 127.0.0.0/8 match: a packet to
//     127.0.0.1 from another host is never DNATed (kube-proxy's rule
//     matches any source);
//   - the external chains already masquerade the node's own sources (a
//     loopback source is LOCAL), so the pod answers the node's address;
//   - the kernel routes 127.0.0.0/8 off the loopback interface only with
//     net.ipv4.conf.all.route_localnet=1, which the agent sets. That also
//     lets other hosts reach services bound to 127.0.0.1
//     (CVE-2020-8558), so STEELYARD-FIREWALL, jumped from filter INPUT,
//     drops packets to 127.0.0.0/8 from other sources that are not replies
//     or DNAT.
//
// With a counter name, filter STEELYARD-SERVICES also counts the first
// packet of each connection DNATed from 127.0.0.0/8 in that nfacct object
// (kube-proxy's localhost_nps_accepted_pkts); it sees them in OUTPUT.

// ChainFirewall (filter, from INPUT for every packet) drops martian packets
// to 127.0.0.0/8 when localhost node ports are on; empty otherwise.
const ChainFirewall Chain = "STEELYARD-FIREWALL"

// LocalhostCounter is the nfacct object counting accepted localhost node
// port connections (their first packets).
const LocalhostCounter = "steelyard_localhost_nps"

// loopbackNet is the IPv4 loopback range.
const loopbackNet = "127.0.0.0/8"

// localhostOn reports whether localhost node ports apply to this family.
func (c Config) localhostOn(family int) bool {
	return c.LocalhostNodePorts && family != 6
}

// renderLocalhost adds the static localhost node port rules to r.
func renderLocalhost(r *Rules, cfg Config, family int) {
	r.chain(TableFilter, ChainFirewall)
	if !cfg.localhostOn(family) {
		return
	}
	r.add(TableFilter, ChainFirewall, "!", "-s", loopbackNet, "-d", loopbackNet,
		"-m", "comment", "--comment", iptk.Quote("steelyard: block incoming localnet connections"),
		"-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP")
	if cfg.localhostCounter != "" {
		r.add(TableFilter, ChainServices, "-m", "conntrack", "--ctstate", "DNAT", "--ctorigdst", loopbackNet,
			"-m", "comment", "--comment", iptk.Quote("steelyard: localhost node ports accepted"),
			"-m", "nfacct", "--nfacct-name", cfg.localhostCounter)
	}
}

// renderLocalhostJumps adds the jumps from STEELYARD-SERVICES to
// STEELYARD-NODEPORTS for loopback, last like the other node addresses.
func renderLocalhostJumps(r *Rules, cfg Config, family int) {
	if !cfg.localhostOn(family) {
		return
	}
	for _, t := range []Table{TableNAT, TableFilter} {
		r.add(t, ChainServices, "-s", loopbackNet, "-d", loopbackNet, "-m", "comment", "--comment", iptk.Quote("steelyard: localhost node ports"), "-j", string(ChainNodePorts))
	}
}

// ensureCounter makes the nfacct object exist before a restore names it;
// without nfacct (no kernel support) the counting rule is left out and the
// node ports still work.
func (p *Proxier) ensureCounter() {
	if p.cfg.NFAcct == nil || !p.cfg.localhostOn(p.cfg.Family) {
		p.cfg.localhostCounter = ""
		return
	}
	if err := p.cfg.NFAcct.Ensure(LocalhostCounter); err != nil {
		if p.cfg.localhostCounter != "" || !p.counterWarned {
			log.WithError(err).Warn("nfacct unavailable: accepted localhost node port packets are not counted")
			p.counterWarned = true
		}
		p.cfg.localhostCounter = ""
		return
	}
	p.cfg.localhostCounter = LocalhostCounter
}
