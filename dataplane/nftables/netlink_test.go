package nftables

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// canonical sorts the blocks of an "nft list table" listing and the
// elements of each map, so two tables with the same content but written
// in another order compare equal.
func canonical(text string) string {
	var blocks []string
	var cur []string
	depth := 0
	for _, line := range strings.Split(text, "\n") {
		l := strings.TrimSpace(line)
		if l == "" {
			continue
		}
		if depth == 1 && strings.HasSuffix(l, "{") {
			cur = nil
		}
		depth += strings.Count(l, "{") - strings.Count(l, "}")
		if depth >= 1 && len(cur) >= 0 {
			cur = append(cur, l)
		}
		if depth == 1 && l == "}" {
			blocks = append(blocks, canonicalBlock(strings.Join(cur, " ")))
			cur = nil
		}
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
	a := "table ip t {\n\tmap m {\n\t\telements = { 1 : goto b,\n\t\t\t2 : goto a }\n\t}\n\tchain b {\n\t\tgoto x\n\t}\n\tchain a {\n\t}\n}\n"
	b := "table ip t {\n\tchain a {\n\t}\n\tchain b {\n\t\tgoto x\n\t}\n\tmap m {\n\t\telements = { 2 : goto a, 1 : goto b }\n\t}\n}\n"
	if canonical(a) != canonical(b) {
		t.Errorf("canonical differs:\n%s\n--\n%s", canonical(a), canonical(b))
	}
	if canonical(a) == canonical(strings.Replace(b, "goto x", "goto y", 1)) {
		t.Error("canonical hides a difference")
	}
}
