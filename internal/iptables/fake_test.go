package iptables

import "testing"

func TestFakeEnforcesKernelRules(t *testing.T) {
	f := NewFake()
	for name, text := range map[string]string{
		"jump to missing chain":  "*nat\n:STEELYARD-A - [0:0]\n-A STEELYARD-A -j STEELYARD-NOPE\nCOMMIT\n",
		"append to missing":      "*nat\n-A STEELYARD-NOPE -j ACCEPT\nCOMMIT\n",
		"delete built-in":        "*nat\n-X PREROUTING\nCOMMIT\n",
		"missing COMMIT":         "*nat\n:STEELYARD-A - [0:0]\n",
		"delete referenced":      "*nat\n:STEELYARD-A - [0:0]\n:STEELYARD-B - [0:0]\n-A STEELYARD-A -j STEELYARD-B\n-X STEELYARD-B\nCOMMIT\n",
		"delete non-empty chain": "*nat\n:STEELYARD-A - [0:0]\n-A STEELYARD-A -j ACCEPT\n-X STEELYARD-A\nCOMMIT\n",
	} {
		before := f.Ruleset().String()
		if err := f.Restore([]byte(text)); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if f.Ruleset().String() != before {
			t.Errorf("%s: a rejected restore changed state", name)
		}
	}
}

// The fake's flush behaves as iptables -F; iptables -X: built-in chains stay
// (empty), user chains go, and other tables are untouched.
func TestFakeFlushTable(t *testing.T) {
	f := NewFake()
	if err := f.Restore([]byte("*nat\n:OTHER - [0:0]\n-A PREROUTING -j OTHER\nCOMMIT\n*filter\n:MINE - [0:0]\n-A FORWARD -j MINE\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	f.FlushTable(TableNAT)
	rs := f.Ruleset()
	if rs.Chain(TableNAT, "OTHER") != nil {
		t.Error("user chain survived the flush")
	}
	if c := rs.Chain(TableNAT, "PREROUTING"); c == nil || len(c.Rules) != 0 {
		t.Errorf("PREROUTING after the flush: %+v", c)
	}
	if ok, _ := f.HasRule(TableFilter, "FORWARD", "-j", "MINE"); !ok {
		t.Error("the filter table was touched")
	}
	if ok, _ := f.HasRule(TableNAT, "PREROUTING", "-j", "OTHER"); ok {
		t.Error("HasRule finds a flushed rule")
	}
}
