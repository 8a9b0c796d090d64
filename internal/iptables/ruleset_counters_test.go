package iptables

import "testing"

// iptables-save -c prints each rule after its counters; they parse into
// the rule, and the fake prints them back the same way.
func TestParseCounters(t *testing.T) {
	text := "*nat\n:STEELYARD-SEP-X - [0:0]\n[3:180] -A STEELYARD-SEP-X -p tcp -m tcp -j DNAT --to-destination 198.19.1.2:8080\n[0:0] -A STEELYARD-SEP-X -j RETURN\nCOMMIT\n"
	rs, err := ParseRuleset([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	rules := rs.Chain(TableNAT, "STEELYARD-SEP-X").Rules
	if len(rules) != 2 || rules[0].Packets != 3 || rules[0].Bytes != 180 || rules[0].Jump != "DNAT" || rules[1].Packets != 0 {
		t.Fatalf("parsed %+v", rules)
	}
	if got := rs.StringCounters(TableNAT); got != text {
		t.Errorf("printed\n%s\nwant\n%s", got, text)
	}
	for _, bad := range []string{"[3:x] -A C -j RETURN", "[3] -A C -j RETURN", "[3:1]-A C -j RETURN", "[3:1] :C - [0:0]"} {
		if _, err := ParseRuleset([]byte("*nat\n" + bad + "\nCOMMIT\n")); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
