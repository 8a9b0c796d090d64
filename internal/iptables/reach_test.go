package iptables

import (
	"net/netip"
	"strings"
	"testing"
)

// Test IP plan: VIP 198.18.0.10; endpoints 198.19.1.2 (X) and 198.19.1.3
// (Y); hairpin mark 0x2000.
const reachRules = `*nat
:PREROUTING ACCEPT [0:0]
:SVC - [0:0]
:MASQ - [0:0]
:HALF - [0:0]
:RET - [0:0]
:SEP-X - [0:0]
:SEP-Y - [0:0]
-A MASQ -j MARK --set-xmark 0x2000/0x2000
-A SVC -m statistic --mode random --probability 0.5000000000 -j SEP-Y
-A SVC -m statistic --mode random --probability 0.5000000000 -j HALF
-A SVC -m statistic --mode random --probability 0.5000000000 -j RET
-A SVC -j SEP-X
-A HALF -m statistic --mode random --probability 0.5000000000 -j DNAT --to-destination 198.19.1.3:80
-A RET -p tcp -j RETURN
-A RET -p tcp -j DNAT --to-destination 198.19.1.3:80
-A SEP-X -s 198.19.1.2/32 -j MASQ
-A SEP-X -p tcp -j DNAT --to-destination 198.19.1.2:80
-A SEP-Y -s 198.19.1.3/32 -j MASQ
-A SEP-Y -p tcp -j DNAT --to-destination 198.19.1.3:80
COMMIT
`

// TraceTo leaves out only chains that can neither reach the destination
// nor hand a share back: SEP-Y ends every walk in it and is left out,
// HALF DNATs half and returns half, RET returns all, and both shares go
// on to SEP-X, so X must get what Trace gives it, hairpin mark included.
func TestTraceToKeepsTheSharesThatComeBack(t *testing.T) {
	rs, err := ParseRuleset([]byte(reachRules))
	if err != nil {
		t.Fatal(err)
	}
	x := netip.MustParseAddr("198.19.1.2")
	p := Packet{Src: x, Dst: netip.MustParseAddr("198.18.0.10"), Protocol: "tcp", DPort: 80}
	full, err := rs.Trace(TableNAT, "SVC", p)
	if err != nil {
		t.Fatal(err)
	}
	reach := rs.NewReach(TableNAT)
	to, err := reach.TraceTo("SVC", p, x)
	if err != nil {
		t.Fatal(err)
	}
	want := onlyTo(full, x)
	if got := onlyTo(to, x); len(want) != 1 || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("TraceTo %+v, Trace %+v", got, want)
	}
	// Half goes to SEP-Y; of the rest, 0.25 of HALF's half and all of
	// RET's come back: 0.5 * 0.75. SEP-X marks the hairpin.
	if w := want[0]; w.Probability != 0.375 || w.Mark != 0x2000 {
		t.Errorf("X gets %+v, want 0.375 with mark 0x2000", w)
	}
	if f := reach.facts["SEP-Y"]; f == nil || !f.closed {
		t.Errorf("SEP-Y ends every walk with its DNAT: %+v", f)
	}
	if reach.facts["HALF"].closed || reach.facts["RET"].closed {
		t.Error("HALF and RET hand shares back: they must not count as closed")
	}
}

// A jump to a missing chain or a loop is an error for TraceTo as for
// Trace: the chain is never left out.
func TestTraceToReportsBrokenJumps(t *testing.T) {
	for name, extra := range map[string]string{
		"missing chain": ":A - [0:0]\n-A A -j GONE\n",
		"loop":          ":A - [0:0]\n:B - [0:0]\n-A A -j B\n-A B -j A\n",
	} {
		text := strings.Replace(reachRules, "-A SVC -j SEP-X\n", "-A SVC -p tcp -j A\n-A SVC -j SEP-X\n", 1)
		text = strings.Replace(text, "COMMIT\n", extra+"COMMIT\n", 1)
		rs, err := ParseRuleset([]byte(text))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		x := netip.MustParseAddr("198.19.1.2")
		p := Packet{Src: x, Dst: netip.MustParseAddr("198.18.0.10"), Protocol: "tcp", DPort: 80}
		if _, err := rs.NewReach(TableNAT).TraceTo("SVC", p, x); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func onlyTo(outs []Outcome, dst netip.Addr) []Outcome {
	var out []Outcome
	for _, o := range outs {
		if o.Verdict == "DNAT" && o.DNAT.Addr() == dst {
			out = append(out, o)
		}
	}
	return out
}
