package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
)

// Rule is one line of skip.txt: a regular expression over a spec's full
// text and why it is there.
type Rule struct {
	Regex  *regexp.Regexp
	Reason string
	Line   int
}

// List is skip.txt parsed: the specs to run are those matching a Focus
// rule and no Skip rule (ginkgo's --focus and --skip, repeated).
type List struct {
	Focus, Skip []Rule
}

// ParseList reads the format of skip.txt:
//
//	# comment
//	focus <regexp> # reason
//	skip  <regexp> # reason
//
// Every rule needs a reason after " # " (a skip without one is an error:
// the file is the record of why a test does not run).
func ParseList(r io.Reader) (List, error) {
	var l List
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		kind, rest, _ := strings.Cut(line, " ")
		expr, reason, ok := strings.Cut(rest, " # ")
		expr, reason = strings.TrimSpace(expr), strings.TrimSpace(reason)
		if !ok || reason == "" {
			return l, fmt.Errorf("skip list line %d: %q has no reason (want `%s <regexp> # reason`)", n, line, kind)
		}
		if expr == "" {
			return l, fmt.Errorf("skip list line %d: empty regexp", n)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return l, fmt.Errorf("skip list line %d: %w", n, err)
		}
		rule := Rule{Regex: re, Reason: reason, Line: n}
		switch kind {
		case "focus":
			l.Focus = append(l.Focus, rule)
		case "skip":
			l.Skip = append(l.Skip, rule)
		default:
			return l, fmt.Errorf("skip list line %d: %q: want focus or skip", n, kind)
		}
	}
	if err := sc.Err(); err != nil {
		return l, err
	}
	if len(l.Focus) == 0 {
		return l, fmt.Errorf("skip list: no focus line")
	}
	return l, nil
}

// Selected reports whether a spec's text is run, and if it is focused but
// skipped, the skip rule that removes it.
func (l List) Selected(text string) (run bool, skippedBy *Rule) {
	focused := false
	for _, f := range l.Focus {
		if f.Regex.MatchString(text) {
			focused = true
			break
		}
	}
	if !focused {
		return false, nil
	}
	for i, s := range l.Skip {
		if s.Regex.MatchString(text) {
			return false, &l.Skip[i]
		}
	}
	return true, nil
}

// GinkgoArgs are the --focus and --skip flags of the list.
func (l List) GinkgoArgs() []string {
	var args []string
	for _, f := range l.Focus {
		args = append(args, "--focus="+f.Regex.String())
	}
	for _, s := range l.Skip {
		args = append(args, "--skip="+s.Regex.String())
	}
	return args
}

// dualStack reports whether a cluster of nodes runs both IP families:
// the harness makes one dual-stack whenever it has a node LAN (two nodes
// or more), the layout of a kind or kubeadm dual-stack cluster.
func dualStack(nodes int) bool { return nodes > 1 }

// dualStackRule is the expression of the dual-stack specs, which skip.txt
// does not list: they run on the dual-stack cluster.
const dualStackRule = `\[Feature:IPv6DualStack\]`

// familyRules adds to l, on a single-stack (one-node) cluster, the skip
// rule of the dual-stack specs: there they would fail, not skip
// ("should have at least one dual-stack node"), and the table would
// count the harness's choice as a proxy's failure.
func familyRules(l List, dual bool) List {
	if dual {
		return l
	}
	l.Skip = append(slices.Clip(l.Skip), Rule{
		Regex:  regexp.MustCompile(dualStackRule),
		Reason: "one node (NODES=1): the cluster is single-stack IPv4 (dual-stack needs the node LAN of two nodes or more)",
	})
	return l
}
