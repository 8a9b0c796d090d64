package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Ruleset is iptables-save (or iptables-restore) text parsed into tables,
// chains and rules. explain and verify read the live kernel through it, the
// packet tracer walks it, and the fake kernel keeps its state in it.
type Ruleset struct {
	Tables map[Table]*SavedTable
	// order keeps the tables in the order they appeared.
	order []Table
}

// SavedTable is one table of a Ruleset.
type SavedTable struct {
	Name   Table
	Chains map[Chain]*SavedChain
	Order  []Chain
}

// SavedChain is one chain: its policy ("-" for user chains) and rules.
type SavedChain struct {
	Name   Chain
	Policy string
	Rules  []*Rule
}

// Rule is one parsed rule.
type Rule struct {
	// Text is the rule as written after "-A CHAIN ".
	Text string

	Src, Dst       *netip.Prefix
	NotSrc, NotDst bool
	Protocol       string
	DPort          int // 0: any
	// Probability is the statistic match's probability; 1 without one.
	Probability float64
	Comment     string
	// NFAcct is the nfacct object a -m nfacct match bumps (it always
	// matches); "" without one.
	NFAcct string
	// Mark match (-m mark [!] --mark value/mask); MarkMask 0: none.
	MarkValue, MarkMask uint32
	NotMark             bool
	// CTStates from -m conntrack [!] --ctstate; NotCTStates: negated.
	CTStates    []string
	NotCTStates bool
	// SrcLocal and DstLocal are -m addrtype --src-type/--dst-type LOCAL:
	// +1 the address must be the node's own, -1 it must not, 0 no match.
	SrcLocal, DstLocal int
	// Recent is the -m recent match (session affinity); nil without one.
	Recent *RecentMatch
	// Jump is the -j target; its options follow in TargetArgs.
	Jump       string
	TargetArgs map[string]string
	// Unknown lists options the tracer does not understand; a rule with
	// any is treated as not matching.
	Unknown []string
	// Packets and Bytes are the rule's own counters, from iptables-save
	// -c ("[packets:bytes] -A ..."); 0 in a dump without them. The kernel
	// keeps them while a restore rewrites other chains (legacy and nft:
	// iptables-restore --noflush carries the counters of untouched rules
	// over) and zeroes them when the rule's own chain is rewritten.
	Packets, Bytes uint64
}

// RecentMatch is a -m recent match as steelyard writes it.
type RecentMatch struct {
	// Name is the list (the endpoint chain's name).
	Name string
	// Check is --rcheck (the client is in the list); otherwise --set (add
	// the client to the list), which always matches.
	Check bool
	// Seconds is --seconds: how recent the entry must be; 0: any.
	Seconds int
}

// ParseRuleset parses iptables-save output or iptables-restore input.
func ParseRuleset(data []byte) (*Ruleset, error) {
	rs := &Ruleset{Tables: map[Table]*SavedTable{}}
	var cur *SavedTable
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			cur = rs.table(Table(l[1:]))
		case l == "COMMIT":
			cur = nil
		case strings.HasPrefix(l, ":"):
			if cur == nil {
				return nil, fmt.Errorf("line %d: chain outside a table", line)
			}
			f := strings.Fields(l[1:])
			if len(f) < 2 {
				return nil, fmt.Errorf("line %d: bad chain line %q", line, l)
			}
			c := cur.chain(Chain(f[0]))
			c.Policy = f[1]
		case strings.HasPrefix(l, "-A "), strings.HasPrefix(l, "["):
			if cur == nil {
				return nil, fmt.Errorf("line %d: rule outside a table", line)
			}
			var pkts, bytes uint64
			if l[0] == '[' {
				var err error
				if pkts, bytes, l, err = cutCounters(l); err != nil {
					return nil, fmt.Errorf("line %d: %w", line, err)
				}
			}
			f := strings.SplitN(l, " ", 3)
			if len(f) < 3 || f[0] != "-A" {
				return nil, fmt.Errorf("line %d: empty rule", line)
			}
			r, err := ParseRule(f[2])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			r.Packets, r.Bytes = pkts, bytes
			c := cur.chain(Chain(f[1]))
			c.Rules = append(c.Rules, r)
		default:
			return nil, fmt.Errorf("line %d: unexpected %q", line, l)
		}
	}
	return rs, sc.Err()
}

func (rs *Ruleset) table(t Table) *SavedTable {
	if st, ok := rs.Tables[t]; ok {
		return st
	}
	st := &SavedTable{Name: t, Chains: map[Chain]*SavedChain{}}
	rs.Tables[t] = st
	rs.order = append(rs.order, t)
	return st
}

func (t *SavedTable) chain(c Chain) *SavedChain {
	if sc, ok := t.Chains[c]; ok {
		return sc
	}
	sc := &SavedChain{Name: c, Policy: "-"}
	t.Chains[c] = sc
	t.Order = append(t.Order, c)
	return sc
}

// Chain returns chain c of table t, or nil.
func (rs *Ruleset) Chain(t Table, c Chain) *SavedChain {
	st := rs.Tables[t]
	if st == nil {
		return nil
	}
	return st.Chains[c]
}

// SteelyardChains returns the chains of table t that steelyard owns.
func (rs *Ruleset) SteelyardChains(t Table) []Chain {
	st := rs.Tables[t]
	if st == nil {
		return nil
	}
	var out []Chain
	for _, c := range st.Order {
		if strings.HasPrefix(string(c), ChainPrefix) {
			out = append(out, c)
		}
	}
	return out
}

// cutCounters splits "[packets:bytes] -A ..." into the counters and the
// rest.
func cutCounters(l string) (pkts, bytes uint64, rest string, err error) {
	ctr, rest, ok := strings.Cut(l[1:], "] ")
	p, b, ok2 := strings.Cut(ctr, ":")
	if !ok || !ok2 {
		return 0, 0, "", fmt.Errorf("bad counters in %q", l)
	}
	if pkts, err = strconv.ParseUint(p, 10, 64); err == nil {
		bytes, err = strconv.ParseUint(b, 10, 64)
	}
	if err != nil {
		return 0, 0, "", fmt.Errorf("bad counters in %q: %w", l, err)
	}
	return pkts, bytes, rest, nil
}

// String renders the ruleset as iptables-save text.
func (rs *Ruleset) String() string { return rs.render(rs.order, false) }

// StringCounters renders table t as iptables-save -c text: each rule after
// its counters.
func (rs *Ruleset) StringCounters(t Table) string {
	if rs.Tables[t] == nil {
		return ""
	}
	return rs.render([]Table{t}, true)
}

func (rs *Ruleset) render(tables []Table, counters bool) string {
	var b strings.Builder
	for _, t := range tables {
		st := rs.Tables[t]
		fmt.Fprintf(&b, "*%s\n", t)
		for _, c := range st.Order {
			policy := st.Chains[c].Policy
			fmt.Fprintf(&b, ":%s %s [0:0]\n", c, policy)
		}
		for _, c := range st.Order {
			for _, r := range st.Chains[c].Rules {
				if counters {
					fmt.Fprintf(&b, "[%d:%d] ", r.Packets, r.Bytes)
				}
				fmt.Fprintf(&b, "-A %s %s\n", c, r.Text)
			}
		}
		b.WriteString("COMMIT\n")
	}
	return b.String()
}

// ParseRule parses the text of one rule (after "-A CHAIN ").
func ParseRule(text string) (*Rule, error) {
	toks, err := Tokenize(text)
	if err != nil {
		return nil, err
	}
	r := &Rule{Text: text, Probability: 1, TargetArgs: map[string]string{}}
	neg := false
	inTarget := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func() (string, error) {
			if i+1 >= len(toks) {
				return "", fmt.Errorf("rule %q: %s needs a value", text, t)
			}
			i++
			return toks[i], nil
		}
		if t == "!" {
			neg = true
			continue
		}
		if inTarget {
			// Target options: "--name value" or a bare flag.
			if strings.HasPrefix(t, "--") {
				if i+1 < len(toks) && !strings.HasPrefix(toks[i+1], "--") {
					r.TargetArgs[t] = toks[i+1]
					i++
				} else {
					r.TargetArgs[t] = ""
				}
			}
			continue
		}
		switch t {
		case "-s", "--source", "-d", "--destination":
			v, err := next()
			if err != nil {
				return nil, err
			}
			p, err := parsePrefix(v)
			if err != nil {
				return nil, fmt.Errorf("rule %q: %w", text, err)
			}
			if t == "-s" || t == "--source" {
				r.Src, r.NotSrc = &p, neg
			} else {
				r.Dst, r.NotDst = &p, neg
			}
		case "-p", "--protocol":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if neg {
				r.Unknown = append(r.Unknown, "! -p")
			}
			r.Protocol = v
		case "-m", "--match":
			// The module name alone matches nothing; its options follow.
			if _, err := next(); err != nil {
				return nil, err
			}
		case "--dport", "--destination-port":
			v, err := next()
			if err != nil {
				return nil, err
			}
			n, err := strconv.Atoi(v)
			if err != nil || neg {
				r.Unknown = append(r.Unknown, t+" "+v)
				break
			}
			r.DPort = n
		case "--mode":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if v != "random" {
				r.Unknown = append(r.Unknown, "--mode "+v)
			}
		case "--probability":
			v, err := next()
			if err != nil {
				return nil, err
			}
			p, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("rule %q: probability %q: %w", text, v, err)
			}
			r.Probability = p
		case "--comment":
			v, err := next()
			if err != nil {
				return nil, err
			}
			r.Comment = v
		case "--nfacct-name":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if neg {
				r.Unknown = append(r.Unknown, "! "+t)
			}
			r.NFAcct = v
		case "--mark":
			v, err := next()
			if err != nil {
				return nil, err
			}
			val, mask, err := ParseMark(v)
			if err != nil {
				return nil, fmt.Errorf("rule %q: %w", text, err)
			}
			r.MarkValue, r.MarkMask, r.NotMark = val, mask, neg
		case "--src-type", "--dst-type":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if v != "LOCAL" {
				r.Unknown = append(r.Unknown, t+" "+v)
				break
			}
			n := 1
			if neg {
				n = -1
			}
			if t == "--src-type" {
				r.SrcLocal = n
			} else {
				r.DstLocal = n
			}
		case "--set", "--rcheck", "--update", "--remove":
			if r.Recent == nil {
				r.Recent = &RecentMatch{}
			}
			switch {
			case neg:
				r.Unknown = append(r.Unknown, "! "+t)
			case t == "--rcheck":
				r.Recent.Check = true
			case t != "--set":
				r.Unknown = append(r.Unknown, t)
			}
		case "--seconds", "--name", "--mask", "--hitcount":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if r.Recent == nil {
				r.Recent = &RecentMatch{}
			}
			switch t {
			case "--seconds":
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("rule %q: --seconds %q: %w", text, v, err)
				}
				r.Recent.Seconds = n
			case "--name":
				r.Recent.Name = v
			case "--hitcount":
				r.Unknown = append(r.Unknown, t+" "+v)
			}
		case "--reap", "--rsource", "--rttl":
		case "--ctstate":
			v, err := next()
			if err != nil {
				return nil, err
			}
			r.CTStates, r.NotCTStates = strings.Split(v, ","), neg
		case "-j", "--jump", "-g", "--goto":
			v, err := next()
			if err != nil {
				return nil, err
			}
			if t == "-g" || t == "--goto" {
				r.Unknown = append(r.Unknown, "goto")
			}
			r.Jump = v
			inTarget = true
		default:
			r.Unknown = append(r.Unknown, t)
		}
		neg = false
	}
	return r, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		return netip.ParsePrefix(s)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// ParseMark parses "value/mask" or "value" (mask all ones).
func ParseMark(s string) (uint32, uint32, error) {
	v, m, hasMask := strings.Cut(s, "/")
	val, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, 0, fmt.Errorf("mark %q: %w", s, err)
	}
	mask := uint64(0xffffffff)
	if hasMask {
		if mask, err = strconv.ParseUint(m, 0, 32); err != nil {
			return 0, 0, fmt.Errorf("mark %q: %w", s, err)
		}
	}
	return uint32(val), uint32(mask), nil
}

// Tokenize splits a rule the way a shell would for iptables-save output:
// whitespace separates, double quotes group, backslash escapes inside quotes.
func Tokenize(s string) ([]string, error) {
	var toks []string
	var cur strings.Builder
	inQuote, have := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inQuote && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			inQuote = !inQuote
			have = true
		case !inQuote && (c == ' ' || c == '\t'):
			if have {
				toks = append(toks, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if inQuote {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	if have {
		toks = append(toks, cur.String())
	}
	return toks, nil
}
