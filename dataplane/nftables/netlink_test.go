package nftables

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/knftables"
)

// canonical sorts the blocks of an "nft list table" listing and the
// elements of each map, so two tables with the same content but written
// in another order compare equal. Every line counts: the table's header
// and any statement at table level (flags, comment) are kept as entries of
// their own, so a difference there is not hidden.
func canonical(text string) string {
	var blocks []string
	var cur []string
	depth := 0
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if l == "" {
			continue
		}
		before := depth
		depth += strings.Count(l, "{") - strings.Count(l, "}")
		switch {
		case before == 0 || (before == 1 && depth == 0):
			// The table's header, or its closing brace.
			blocks = append(blocks, l)
		case before == 1 && depth == 1:
			// A statement at table level, or a block on one line.
			blocks = append(blocks, canonicalBlock(l))
		default:
			// Inside a chain, set or map: it ends back at depth 1.
			cur = append(cur, l)
			if depth == 1 {
				blocks = append(blocks, canonicalBlock(strings.Join(cur, " ")))
				cur = nil
			}
		}
	}
	if len(cur) > 0 {
		// An unterminated block still counts.
		blocks = append(blocks, canonicalBlock(strings.Join(cur, " ")))
	}
	slices.Sort(blocks)
	return strings.Join(blocks, "\n")
}

var elementsRe = regexp.MustCompile(`elements = \{ (.*?) \}`)

func canonicalBlock(b string) string {
	return elementsRe.ReplaceAllStringFunc(b, func(m string) string {
		inner := elementsRe.FindStringSubmatch(m)[1]
		parts := strings.Split(inner, ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		slices.Sort(parts)
		return "elements = { " + strings.Join(parts, ", ") + " }"
	})
}

func TestCanonical(t *testing.T) {
	d1 := "ip t c 3\n  [ meta load l4proto => reg 1 ]\nip t @m\n\telement 1 : goto c\n\telement 0 : goto c\n"
	d2 := "ip t @m\n\telement 0 : goto c\n\telement 1 : goto c\nip t c 7\n  [ meta load l4proto => reg 1 ]\n"
	if canonicalDebug(d1) != canonicalDebug(d2) {
		t.Errorf("canonicalDebug differs:\n%s\n--\n%s", canonicalDebug(d1), canonicalDebug(d2))
	}
	if canonicalDebug(d1) == canonicalDebug(strings.Replace(d2, "reg 1 ]", "reg 9 ]", 1)) {
		t.Error("canonicalDebug hides a difference")
	}
	a := "table ip t {\n\tmap m {\n\t\telements = { 1 : goto b,\n\t\t\t2 : goto a }\n\t}\n\tchain b {\n\t\tgoto x\n\t}\n\tchain a {\n\t}\n}\n"
	b := "table ip t {\n\tchain a {\n\t}\n\tchain b {\n\t\tgoto x\n\t}\n\tmap m {\n\t\telements = { 2 : goto a, 1 : goto b }\n\t}\n}\n"
	if canonical(a) != canonical(b) {
		t.Errorf("canonical differs:\n%s\n--\n%s", canonical(a), canonical(b))
	}
	// Each of these edits of b must show: a rule, a chain's name, the
	// table's family or name, a statement at table level, a map element.
	for _, edit := range [][2]string{
		{"goto x", "goto y"},
		{"chain a {", "chain c {"},
		{"table ip t {", "table ip6 t {"},
		{"table ip t {", "table ip u {"},
		{"table ip t {", "table ip t {\n\tflags dormant"},
		{"table ip t {", "table ip t {\n\tcomment \"x\""},
		{"2 : goto a", "3 : goto a"},
	} {
		if !strings.Contains(b, edit[0]) {
			t.Fatalf("edit %q: not in b", edit[0])
		}
		if canonical(a) == canonical(strings.Replace(b, edit[0], edit[1], 1)) {
			t.Errorf("canonical hides the edit %q -> %q", edit[0], edit[1])
		}
	}
}

// debugHeader is the first line of an object in "nft --debug=netlink"
// output: "ip steelyard CHAIN HANDLE [PREVIOUS]" for a rule, "ip steelyard @SET" for
// a set's elements.
var debugHeader = regexp.MustCompile(`^(ip6?) (\S+) (\S+)( \d+)*$`)

// weightMapRecord is the header of a weight map's elements in the
// canonical debug output; zeroEnd is nft's end element at 0.
var (
	weightMapRecord = regexp.MustCompile(` @(` + strings.Join(sharedPrefixes, `|`) + `|` + countPrefix + `[cl]-)`)
	zeroEnd         = regexp.MustCompile(`^element 00000000\s+: 1 \[end\]$`)
)

// canonicalDebug canonicalizes "nft --debug=netlink list table" output:
// the bytecode records (rule handles dropped, element lines sorted, records
// sorted) and then the listing, through canonical.
func canonicalDebug(text string) string {
	i := strings.Index(text, "\ntable ")
	if strings.HasPrefix(text, "table ") {
		i = 0
	}
	debug, listing := text, ""
	if i >= 0 {
		debug, listing = text[:i], text[i:]
	}
	var records []string
	var cur []string
	flush := func() {
		// The cluster CIDRs are an interval set nft rewrites on every full
		// sync; its bytecode keeps a null start element depending on
		// history, so only its listing (below) is compared.
		if len(cur) > 0 && !strings.HasSuffix(cur[0], " @"+setClusterCIDRs) {
			body := cur[1:]
			// nft starts each "add element" of an interval map with an
			// end element at 0, which no range owns and no lookup
			// needs (mapElem.netlink does not send it): a weight map's
			// element lines are compared without it.
			if weightMapRecord.MatchString(cur[0]) {
				body = slices.DeleteFunc(slices.Clone(body), zeroEnd.MatchString)
			}
			if strings.Contains(cur[0], " @") {
				slices.Sort(body)
			}
			records = append(records, strings.Join(append([]string{cur[0]}, body...), "\n"))
		}
		cur = nil
	}
	for _, line := range strings.Split(debug, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if m := debugHeader.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t") {
			flush()
			cur = []string{m[1] + " " + m[2] + " " + m[3]}
			continue
		}
		cur = append(cur, strings.TrimSpace(line))
	}
	flush()
	slices.Sort(records)
	return strings.Join(records, "\n") + "\n" + canonical(listing)
}

// TestScriptGroupsElements: the nft input of a transaction writes
// consecutive plain additions to one set as one command, and everything
// else (flushes, elements with comments, deletions) as knftables spells it,
// in order.
func TestScriptGroupsElements(t *testing.T) {
	f := famOf(4)
	tcp := protoNumbers["tcp"]
	ap := netip.MustParseAddrPort
	t0 := &ops{}
	t0.AddElem(mapElem{"dc-a", tcp, &wmElem{lo: 0, hi: 9, dnat: ap("198.19.1.2:8080")}})
	t0.AddElem(mapElem{"dc-a", tcp, &wmElem{lo: 10, hi: 99, dnat: ap("198.19.1.3:8080")}})
	t0.AddElem(newHairpinKey(netip.MustParseAddr("198.19.1.2"), tcp, 8080))
	t0.Flush(&knftables.Map{Name: "dc-b"})
	t0.AddElem(mapElem{"dc-b", tcp, &wmElem{lo: 0, hi: 99, dnat: ap("198.19.1.4:8080")}})
	vip := func(a string) svcKey { return svcKey{netip.MustParseAddr(a), tcp, 80} }
	t0.AddElem(sharedElem{elem{mapServiceIPs, vip("198.18.0.10"), goTo("svc-x"), ""}, knftables.PtrTo("default/a:http")})
	t0.AddElem(sharedElem{elem{mapServiceIPs, vip("198.18.0.11"), goTo("svc-y"), ""}, knftables.PtrTo("default/b:http")})
	t0.AddElem(mapElem{"wc-b", tcp, &wmElem{lo: 100, hi: 199, to: goTo("ep-a")}})
	t0.DeleteElem(mapElem{"wc-b", tcp, &wmElem{lo: 0, hi: 99, to: goTo("ep-a")}})
	t0.AddRule("svc-x", nil, r(l4proto(tcp), numgenDNAT{100, 0, "dc-a"}))
	want := "add element ip steelyard dc-a { 0-9 : 198.19.1.2 . 8080, 10-99 : 198.19.1.3 . 8080 }\n" +
		"add element ip steelyard hairpin { 198.19.1.2 . tcp . 8080 . 198.19.1.2 }\n" +
		"flush map ip steelyard dc-b\n" +
		"add element ip steelyard dc-b { 0-99 : 198.19.1.4 . 8080 }\n" +
		"add element ip steelyard service-ips { 198.18.0.10 . tcp . 80 comment \"default/a:http\" : goto svc-x }\n" +
		"add element ip steelyard service-ips { 198.18.0.11 . tcp . 80 comment \"default/b:http\" : goto svc-y }\n" +
		"add element ip steelyard wc-b { 100-199 : goto ep-a }\n" +
		"delete element ip steelyard wc-b { 0-99 }\n" +
		"add rule ip steelyard svc-x meta l4proto tcp dnat ip to numgen random mod 100 map @dc-a\n"
	fake := knftables.NewFake(f.nfFamily, TableName)
	got, err := t0.script(fake.NewTransaction, f)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// An operation knftables refuses fails the whole script.
	t0.Add(&knftables.Chain{})
	if _, err := t0.script(fake.NewTransaction, f); err == nil {
		t.Error("a chain without a name was written")
	}
}
