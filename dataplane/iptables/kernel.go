package iptables

import (
	iptk "github.com/steelyard-net/steelyard/internal/iptables"
)

// The kernel wrapper, its Fake, the parsed ruleset and its packet tracer live in
// internal/iptables so the IPVS dataplane can share them without importing
// this one; these aliases keep this package's API unchanged.
type (
	// Interface is the narrow view of the kernel (internal/iptables).
	Interface = iptk.Interface
	// Mode is the iptables flavour (nft or legacy).
	Mode = iptk.Mode
	// Fake is the in-memory kernel for unit tests.
	Fake = iptk.Fake
	// Chain is an iptables chain name.
	Chain = iptk.Chain
	// Table is an iptables table name.
	Table = iptk.Table
	// Ruleset is a parsed iptables-save dump.
	Ruleset = iptk.Ruleset
	// SavedTable is one table of a Ruleset.
	SavedTable = iptk.SavedTable
	// SavedChain is one chain of a SavedTable.
	SavedChain = iptk.SavedChain
	// Rule is one parsed rule.
	Rule = iptk.Rule
	// RecentMatch is a parsed "-m recent" match.
	RecentMatch = iptk.RecentMatch
	// Packet is the first packet of a connection, as the tracer sees it.
	Packet = iptk.Packet
	// Outcome is where a share of new connections ends up.
	Outcome = iptk.Outcome
	// TraceInfo is what a trace saw besides outcomes.
	TraceInfo = iptk.TraceInfo
	// Reach tells which DNAT destinations a chain can lead to.
	Reach = iptk.Reach
)

// The iptables flavours, tables and steelyard's chain prefix.
const (
	ModeAuto    = iptk.ModeAuto
	ModeNFT     = iptk.ModeNFT
	ModeLegacy  = iptk.ModeLegacy
	TableNAT    = iptk.TableNAT
	TableFilter = iptk.TableFilter
	ChainPrefix = iptk.ChainPrefix
)

// Functions of internal/iptables this package re-exports.
var (
	// New returns the real Interface for a mode.
	New = iptk.New
	// New6 returns the real IPv6 Interface for a mode.
	New6 = iptk.New6
	// Detect returns the host's iptables flavour.
	Detect = iptk.Detect
	// NewFake returns an empty Fake.
	NewFake = iptk.NewFake
	// ParseRuleset parses iptables-save output.
	ParseRuleset = iptk.ParseRuleset
	// ParseRule parses one rule.
	ParseRule = iptk.ParseRule
)
