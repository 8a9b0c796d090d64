// Package iptables is steelyard's narrow interface to the iptables tools
// (iptables-save, iptables-restore and the few single-rule operations), a
// parsed iptables-save ruleset, and an in-memory Fake that enforces what the
// kernel enforces. It holds no steelyard rule logic, so every dataplane that
// needs iptables (the iptables dataplane, IPVS for masquerading and
// filtering) can share it without importing another dataplane.
package iptables

import "strings"

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table name.
type Table string

// The tables steelyard writes to.
const (
	TableNAT    Table = "nat"
	TableFilter Table = "filter"
)

// ChainPrefix starts every chain steelyard creates; cleanup and the readers
// rely on it to touch nothing else.
const ChainPrefix = "STEELYARD-"

// builtinChains have a policy; walking off their end applies it.
var builtinChains = map[Chain]bool{
	"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true,
}

// BuiltinChain reports whether c is one of the kernel's built-in chains.
func BuiltinChain(c Chain) bool { return builtinChains[c] }

// Quote quotes s for iptables-restore input.
func Quote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}
