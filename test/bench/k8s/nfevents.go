package main

import (
	"encoding/binary"
	"net/netip"
)

// The nf_tables notifications the kernel multicasts on commit
// (include/uapi/linux/netfilter/nf_tables.h, nfnetlink.h).
const (
	nfnlSubsysNFTables = 10 // NFNL_SUBSYS_NFTABLES: the high byte of nlmsg_type
	nfnlgrpNFTables    = 7  // NFNLGRP_NFTABLES

	nftMsgNewChain   = 3  // NFT_MSG_NEWCHAIN
	nftMsgNewRule    = 6  // NFT_MSG_NEWRULE
	nftMsgNewSetElem = 12 // NFT_MSG_NEWSETELEM
	nftMsgNewGen     = 15 // NFT_MSG_NEWGEN: ends each committed transaction

	// nftaTable is the first attribute of a chain, a rule and a set
	// element list alike: NFTA_CHAIN_TABLE, NFTA_RULE_TABLE,
	// NFTA_SET_ELEM_LIST_TABLE, a NUL-terminated name.
	nftaTable = 1

	nlmsgHdrLen  = 16 // struct nlmsghdr
	nfgenmsgLen  = 4  // struct nfgenmsg: family, version, res_id
	nlaHdrLen    = 4  // struct nlattr
	nlaTypeMask  = 0x3fff
	familyIPv4   = 2 // NFPROTO_IPV4 (AF_INET)
	nlmsgAlignTo = 4
)

// nftEvent is what the benchmark reads from one notification.
type nftEvent struct {
	msg   uint8  // nftMsgNewRule, ...
	table string // "" for NEWGEN
	// addrs are the IPv4 addresses in the pod range 198.19.0.0/16 found
	// in the message's attributes (see podAddrs).
	addrs []netip.Addr
}

// parseNFTMessages splits one netlink datagram into its messages and
// returns the NEWCHAIN, NEWRULE, NEWSETELEM (family ip) and NEWGEN ones;
// other messages (deletions, tables, sets, other subsystems, errors) are
// skipped. It never panics on short or malformed input: what does not
// parse is dropped.
func parseNFTMessages(b []byte) []nftEvent {
	var out []nftEvent
	for len(b) >= nlmsgHdrLen {
		n := int(binary.NativeEndian.Uint32(b[0:4]))
		typ := binary.NativeEndian.Uint16(b[4:6])
		if n < nlmsgHdrLen || n > len(b) {
			break
		}
		msg := b[:n]
		if adv := align(n); adv < len(b) {
			b = b[adv:]
		} else {
			b = nil
		}
		if typ>>8 != nfnlSubsysNFTables || len(msg) < nlmsgHdrLen+nfgenmsgLen {
			continue
		}
		kind := uint8(typ & 0xff)
		if kind == nftMsgNewGen {
			out = append(out, nftEvent{msg: kind})
			continue
		}
		if kind != nftMsgNewChain && kind != nftMsgNewRule && kind != nftMsgNewSetElem {
			continue
		}
		if msg[nlmsgHdrLen] != familyIPv4 {
			continue
		}
		attrs := msg[nlmsgHdrLen+nfgenmsgLen:]
		ev := nftEvent{msg: kind, table: tableName(attrs)}
		ev.addrs = podAddrs(attrs)
		out = append(out, ev)
	}
	return out
}

// tableName returns the NUL-terminated string of the first-level
// attribute nftaTable, "" when there is none.
func tableName(attrs []byte) string {
	for len(attrs) >= nlaHdrLen {
		l := int(binary.NativeEndian.Uint16(attrs[0:2]))
		t := binary.NativeEndian.Uint16(attrs[2:4]) & nlaTypeMask
		if l < nlaHdrLen || l > len(attrs) {
			return ""
		}
		if t == nftaTable {
			v := attrs[nlaHdrLen:l]
			for i, c := range v {
				if c == 0 {
					return string(v[:i])
				}
			}
			return string(v)
		}
		if adv := align(l); adv < len(attrs) {
			attrs = attrs[adv:]
		} else {
			return ""
		}
	}
	return ""
}

// podAddrs returns the distinct 4-byte words of attrs that are addresses
// in 198.19.0.0/16, in order. Every netlink attribute and every register
// of an nftables data value starts on a 4-byte boundary, so an address
// anywhere in the message (an immediate loaded for `dnat to IP:port`, the
// operand of `ip saddr IP`, a map element's key or its `addr . port`
// value) is one aligned word: no expression or set layout has to be
// decoded, which makes this match both kube-proxy's endpoint chains and a
// map-element layout. The benchmark's changed endpoints take addresses
// never used before (world.changeAddr), so one found here is the change.
func podAddrs(attrs []byte) []netip.Addr {
	var out []netip.Addr
	for i := 0; i+4 <= len(attrs); i += 4 {
		if attrs[i] != 198 || attrs[i+1] != 19 {
			continue
		}
		a := netip.AddrFrom4([4]byte(attrs[i : i+4]))
		seen := false
		for _, x := range out {
			if x == a {
				seen = true
				break
			}
		}
		if !seen {
			out = append(out, a)
		}
	}
	return out
}

func align(n int) int { return (n + nlmsgAlignTo - 1) &^ (nlmsgAlignTo - 1) }
