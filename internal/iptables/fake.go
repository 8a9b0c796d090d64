package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is an in-memory kernel for unit tests. It keeps real state and
// enforces what the kernel enforces: a restore applies completely or not at
// all; a rule may only be appended to a chain that exists; a jump to a
// missing chain fails; a chain can only be deleted when it is empty and
// nothing jumps to it; built-in chains cannot be deleted; a comment keeps
// its first 255 bytes.
type Fake struct {
	mu sync.Mutex
	rs *Ruleset
	// Restores counts successful restores; RestoreErr, when set, makes the
	// next Restore fail without changing anything.
	Restores   int
	RestoreErr error
	// LastRestore is the input of the last Restore call.
	LastRestore []byte
}

var _ Interface = (*Fake)(nil)

// commentMax is the comment match's limit (XT_MAX_COMMENT_LEN less its NUL).
const commentMax = 255

// builtinTargets are targets that are not chains.
var builtinTargets = map[string]bool{
	"ACCEPT": true, "DROP": true, "RETURN": true, "REJECT": true, "DNAT": true, "SNAT": true,
	"MASQUERADE": true, "MARK": true, "LOG": true, "CONNMARK": true, "CT": true, "NOTRACK": true,
}

// NewFake returns a Fake with empty filter and nat tables.
func NewFake() *Fake {
	rs := &Ruleset{Tables: map[Table]*SavedTable{}}
	for _, c := range []Chain{"INPUT", "FORWARD", "OUTPUT"} {
		rs.table(TableFilter).chain(c).Policy = "ACCEPT"
	}
	for _, c := range []Chain{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"} {
		rs.table(TableNAT).chain(c).Policy = "ACCEPT"
	}
	return &Fake{rs: rs}
}

// Ruleset returns a copy of the current state.
func (f *Fake) Ruleset() *Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rs.clone()
}

// SaveAll implements Interface.
func (f *Fake) SaveAll() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []byte(f.rs.String()), nil
}

// SaveCounters implements Interface. A rule's counters live as long as
// the rule: a restore that rewrites its chain makes new rules, counting
// from 0, as the kernel does; other chains keep theirs.
func (f *Fake) SaveCounters(t Table) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []byte(f.rs.StringCounters(t)), nil
}

// Count adds packets to the counter of rule i (from 0) of chain c, as
// traffic through it would.
func (f *Fake) Count(t Table, c Chain, i int, packets uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.rs.Chain(t, c)
	if ch == nil || i >= len(ch.Rules) {
		return fmt.Errorf("fake: no rule %d in %s/%s", i, t, c)
	}
	ch.Rules[i].Packets += packets
	return nil
}

// Restore implements Interface with --noflush semantics.
func (f *Fake) Restore(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.LastRestore = append([]byte(nil), data...)
	if err := f.RestoreErr; err != nil {
		f.RestoreErr = nil
		return err
	}
	next := f.rs.clone()
	var cur *SavedTable
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	n := 0
	for sc.Scan() {
		n++
		l := strings.TrimSpace(sc.Text())
		fail := func(format string, a ...any) error {
			return fmt.Errorf("iptables-restore (fake): line %d: %s", n, fmt.Sprintf(format, a...))
		}
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			cur = next.table(Table(l[1:]))
		case l == "COMMIT":
			if cur == nil {
				return fail("COMMIT outside a table")
			}
			if err := cur.checkJumps(); err != nil {
				return fail("%v", err)
			}
			cur = nil
		case cur == nil:
			return fail("%q outside a table", l)
		case strings.HasPrefix(l, ":"):
			f := strings.Fields(l[1:])
			if len(f) < 2 {
				return fail("bad chain line %q", l)
			}
			c := Chain(f[0])
			if builtinChains[c] {
				cur.chain(c).Policy = f[1]
				continue
			}
			// Declaring a user chain creates it or flushes it.
			cur.chain(c).Rules = nil
		case strings.HasPrefix(l, "-A "), strings.HasPrefix(l, "-X "), strings.HasPrefix(l, "-F "):
			parts := strings.SplitN(l, " ", 3)
			c := cur.Chains[Chain(parts[1])]
			if c == nil {
				return fail("chain %s does not exist", parts[1])
			}
			switch parts[0] {
			case "-F":
				c.Rules = nil
			case "-X":
				if builtinChains[c.Name] {
					return fail("cannot delete built-in chain %s", c.Name)
				}
				if len(c.Rules) > 0 {
					return fail("chain %s is not empty", c.Name)
				}
				delete(cur.Chains, c.Name)
				cur.Order = slices.DeleteFunc(cur.Order, func(x Chain) bool { return x == c.Name })
			case "-A":
				if len(parts) < 3 {
					return fail("empty rule")
				}
				r, err := ParseRule(parts[2])
				if err != nil {
					return fail("%v", err)
				}
				// The comment match keeps 255 bytes and drops the rest
				// without an error (iptables 1.8.9, legacy and nft,
				// checked in a network namespace).
				if len(r.Comment) > commentMax {
					r.Comment = r.Comment[:commentMax]
				}
				if r.Jump != "" && !builtinTargets[r.Jump] && cur.Chains[Chain(r.Jump)] == nil {
					return fail("jump to missing chain %s", r.Jump)
				}
				c.Rules = append(c.Rules, r)
			}
		default:
			return fail("unsupported line %q", l)
		}
	}
	if cur != nil {
		return fmt.Errorf("iptables-restore (fake): missing COMMIT for table %s", cur.Name)
	}
	f.rs = next
	f.Restores++
	return nil
}

func (t *SavedTable) checkJumps() error {
	for _, c := range t.Order {
		for _, r := range t.Chains[c].Rules {
			if r.Jump != "" && !builtinTargets[r.Jump] && t.Chains[Chain(r.Jump)] == nil {
				return fmt.Errorf("chain %s jumps to missing chain %s", c, r.Jump)
			}
		}
	}
	return nil
}

// EnsureChain implements Interface.
func (f *Fake) EnsureChain(t Table, c Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rs.table(t).chain(c)
	return nil
}

// EnsureRule implements Interface.
func (f *Fake) EnsureRule(t Table, c Chain, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.rs.Chain(t, c)
	if ch == nil {
		return fmt.Errorf("chain %s/%s does not exist", t, c)
	}
	text := JoinArgs(args)
	for _, r := range ch.Rules {
		if r.Text == text {
			return nil
		}
	}
	r, err := ParseRule(text)
	if err != nil {
		return err
	}
	if r.Jump != "" && !builtinTargets[r.Jump] && f.rs.Chain(t, Chain(r.Jump)) == nil {
		return fmt.Errorf("jump to missing chain %s", r.Jump)
	}
	ch.Rules = append([]*Rule{r}, ch.Rules...)
	return nil
}

// HasRule implements Interface.
func (f *Fake) HasRule(t Table, c Chain, args ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.rs.Chain(t, c)
	if ch == nil {
		return false, nil
	}
	text := JoinArgs(args)
	return slices.ContainsFunc(ch.Rules, func(r *Rule) bool { return r.Text == text }), nil
}

// FlushTable empties every chain of table t and deletes its user chains,
// the way "iptables -t T -F; iptables -t T -X" (or a firewall reload that
// restores the table without --noflush) would.
func (f *Fake) FlushTable(t Table) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.rs.Tables[t]
	if st == nil {
		return
	}
	for _, c := range st.Order {
		if builtinChains[c] {
			st.Chains[c].Rules = nil
			continue
		}
		delete(st.Chains, c)
	}
	st.Order = slices.DeleteFunc(st.Order, func(c Chain) bool { return !builtinChains[c] })
}

// DeleteRule implements Interface.
func (f *Fake) DeleteRule(t Table, c Chain, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.rs.Chain(t, c)
	if ch == nil {
		return nil
	}
	text := JoinArgs(args)
	ch.Rules = slices.DeleteFunc(ch.Rules, func(r *Rule) bool { return r.Text == text })
	return nil
}

// DeleteChain implements Interface.
func (f *Fake) DeleteChain(t Table, c Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.rs.Tables[t]
	if st == nil || st.Chains[c] == nil {
		return nil
	}
	for _, other := range st.Chains {
		for _, r := range other.Rules {
			if r.Jump == string(c) {
				return fmt.Errorf("chain %s/%s is referenced by %s", t, c, other.Name)
			}
		}
	}
	delete(st.Chains, c)
	st.Order = slices.DeleteFunc(st.Order, func(x Chain) bool { return x == c })
	return nil
}

// AddRule appends a foreign rule, for tests that check steelyard leaves
// other people's rules alone.
func (f *Fake) AddRule(t Table, c Chain, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := ParseRule(JoinArgs(args))
	if err != nil {
		return err
	}
	ch := f.rs.table(t).chain(c)
	ch.Rules = append(ch.Rules, r)
	return nil
}

// DeleteRuleAt deletes the n-th rule (1-based) of a chain, the way an
// operator's "iptables -D CHAIN n" would.
func (f *Fake) DeleteRuleAt(t Table, c Chain, n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := f.rs.Chain(t, c)
	if ch == nil || n < 1 || n > len(ch.Rules) {
		return fmt.Errorf("no rule %d in %s/%s", n, t, c)
	}
	ch.Rules = slices.Delete(ch.Rules, n-1, n)
	return nil
}

// JoinArgs joins rule arguments the way iptables-save prints them, quoting
// the empty ones and those with blanks or quotes.
func JoinArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\"") {
			a = Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

func (rs *Ruleset) clone() *Ruleset {
	out := &Ruleset{Tables: map[Table]*SavedTable{}, order: slices.Clone(rs.order)}
	for name, t := range rs.Tables {
		nt := &SavedTable{Name: name, Chains: map[Chain]*SavedChain{}, Order: slices.Clone(t.Order)}
		for cn, c := range t.Chains {
			nt.Chains[cn] = &SavedChain{Name: cn, Policy: c.Policy, Rules: slices.Clone(c.Rules)}
		}
		out.Tables[name] = nt
	}
	return out
}
