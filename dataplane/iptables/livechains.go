package iptables

import (
	iptk "github.com/steelyard-net/steelyard/internal/iptables"

	"fmt"
	"strings"
)

// liveChains is iptables-save output cut into the rule texts of
// steelyard's chains, which is all a full Sync compares. No rule is parsed
// and every text is a substring of one string: at 10,000 Services
// ParseRuleset (which explain needs) allocates about 450 MB in 8.6 million
// objects, this a fraction of that.
type liveChains struct {
	// rules holds the rule texts (after "-A CHAIN ") of each steelyard
	// chain; a declared chain without rules maps to nil.
	rules map[Table]map[Chain][]string
	// order lists each table's steelyard chains as saved.
	order map[Table][]Chain
	// jumps holds the rules of built-in chains that name a steelyard
	// chain, so a full Sync checks its jumps without one iptables call
	// each (iptables-legacy reads the whole table for every call).
	jumps map[Table]map[Chain][]string
}

// cutSaved reads iptables-save output. Other components' chains and rules
// are skipped, not kept.
func cutSaved(data []byte) (*liveChains, error) {
	lc := &liveChains{rules: map[Table]map[Chain][]string{}, order: map[Table][]Chain{}, jumps: map[Table]map[Chain][]string{}}
	text := string(data)
	var cur Table
	for n := 1; text != ""; n++ {
		l, rest, _ := strings.Cut(text, "\n")
		text = rest
		l = strings.TrimSpace(l)
		switch {
		case l == "" || l[0] == '#':
		case l[0] == '*':
			cur = Table(l[1:])
			if lc.rules[cur] == nil {
				lc.rules[cur] = map[Chain][]string{}
			}
		case l == "COMMIT":
			cur = ""
		case l[0] == ':':
			if cur == "" {
				return nil, fmt.Errorf("line %d: chain outside a table", n)
			}
			name, _, _ := strings.Cut(l[1:], " ")
			c := Chain(name)
			if !strings.HasPrefix(name, ChainPrefix) {
				continue
			}
			if _, ok := lc.rules[cur][c]; !ok {
				lc.rules[cur][c] = nil
				lc.order[cur] = append(lc.order[cur], c)
			}
		case strings.HasPrefix(l, "-A "):
			if cur == "" {
				return nil, fmt.Errorf("line %d: rule outside a table", n)
			}
			name, rule, ok := strings.Cut(l[3:], " ")
			if !ok || rule == "" {
				return nil, fmt.Errorf("line %d: empty rule", n)
			}
			c := Chain(name)
			if iptk.BuiltinChain(c) && strings.Contains(rule, ChainPrefix) {
				if lc.jumps[cur] == nil {
					lc.jumps[cur] = map[Chain][]string{}
				}
				lc.jumps[cur][c] = append(lc.jumps[cur][c], rule)
			}
			if !strings.HasPrefix(name, ChainPrefix) {
				continue
			}
			if _, ok := lc.rules[cur][c]; !ok {
				lc.order[cur] = append(lc.order[cur], c)
			}
			lc.rules[cur][c] = append(lc.rules[cur][c], rule)
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", n, l)
		}
	}
	return lc, nil
}

// chain returns the rules of chain c in table t and whether it exists.
func (lc *liveChains) chain(t Table, c Chain) ([]string, bool) {
	r, ok := lc.rules[t][c]
	return r, ok
}

// hasJump reports whether the saved rules hold jump j and its target
// chain.
func (lc *liveChains) hasJump(j jump) bool {
	if _, ok := lc.chain(j.table, j.target()); !ok {
		return false
	}
	want := iptk.JoinArgs(j.args)
	for _, r := range lc.jumps[j.table][j.from] {
		if sameRule(r, want) {
			return true
		}
	}
	return false
}
