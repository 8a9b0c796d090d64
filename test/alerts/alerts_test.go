package alerts

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"go.yaml.in/yaml/v3"
)

// rule is one entry of a rule group, as docs/operations.md writes it.
type rule struct {
	Record string `yaml:"record"`
	Alert  string `yaml:"alert"`
	Expr   string `yaml:"expr"`
	For    string `yaml:"for"`
}

// docRules reads the example rules: the yaml block of docs/operations.md
// that defines groups.
func docRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(b), "```yaml\n")[1:] {
		text, _, _ := strings.Cut(block, "```")
		if !strings.HasPrefix(text, "groups:") {
			continue
		}
		var doc struct {
			Groups []struct {
				Rules []rule `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatalf("the rules of docs/operations.md: %v", err)
		}
		var out []rule
		for _, g := range doc.Groups {
			out = append(out, g.Rules...)
		}
		return out
	}
	t.Fatal("docs/operations.md: no yaml block of rule groups")
	return nil
}

// inlined returns the expression of rule name with every recording rule
// it uses (defined before it) replaced by that rule's own expression: at
// one instant the same as the recorded series.
func inlined(t *testing.T, rules []rule, name string) (string, rule) {
	t.Helper()
	records := map[string]string{}
	var order []string
	for _, r := range rules {
		expr := r.Expr
		for _, rec := range order {
			expr = strings.ReplaceAll(expr, rec, "("+records[rec]+")")
		}
		if r.Record != "" {
			records[r.Record] = expr
			order = append(order, r.Record)
		}
		if r.Alert == name {
			return expr, r
		}
	}
	t.Fatalf("no alert %s in docs/operations.md", name)
	return "", rule{}
}

// Every documented rule is valid PromQL.
func TestRulesParse(t *testing.T) {
	for _, r := range docRules(t) {
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr); err != nil {
			t.Errorf("%s%s: %v", r.Alert, r.Record, err)
		}
	}
}

// series writes the load lines of one Service port on node n1: each
// endpoint's configured ratio (constant) and its count, growing by perMin
// new connections a minute for two hours.
func series(service string, eps map[string][2]float64) string {
	var b strings.Builder
	names := make([]string, 0, len(eps))
	for ep := range eps {
		names = append(names, ep)
	}
	sort.Strings(names)
	for _, ep := range names {
		ratio, perMin := eps[ep][0], eps[ep][1]
		l := fmt.Sprintf(`{instance="n1",namespace="ns",service=%q,port="http",endpoint=%q}`, service, ep)
		fmt.Fprintf(&b, "  steelyard_endpoint_configured_ratio%s %gx120\n", l, ratio)
		fmt.Fprintf(&b, "  steelyard_endpoint_new_connections_total%s 0+%gx120\n", l, perMin)
	}
	return b.String()
}

// SteelyardSplitDiverges on synthetic counts, 1,200 new connections an
// hour per port (the 10% endpoint's standard deviation: sqrt(1200 x 0.1 x
// 0.9) = 10.4 connections, the threshold 4 of them plus 1 = 42.6):
//   - noise: 10/90 configured, 132/1,068 counted (+12, 1.2 sigma): silent
//   - drift: 10/90 configured, 180/1,020 counted (+60, 5.8 sigma): fires
//   - dead: 10/90 configured, the 10% endpoint never chosen: fires
//   - zero: an endpoint configured at 0 that still gets 60 an hour: fires
//
// The expression must hold (or not) at every minute of the alert's "for"
// window before the end of the second hour.
func TestSplitDiverges(t *testing.T) {
	rules := docRules(t)
	expr, alert := inlined(t, rules, "SteelyardSplitDiverges")
	load := "load 1m\n" +
		series("noise", map[string][2]float64{"a": {0.1, 2.2}, "b": {0.9, 17.8}}) +
		series("drift", map[string][2]float64{"a": {0.1, 3}, "b": {0.9, 17}}) +
		series("dead", map[string][2]float64{"a": {0.1, 0}, "b": {0.9, 20}}) +
		series("zero", map[string][2]float64{"a": {0, 1}, "b": {1, 19}})
	storage := promqltest.LoadedStorage(t, load)
	engine := promqltest.NewTestEngine(t, false, 0, 1_000_000)
	forDur, err := time.ParseDuration(alert.For)
	if err != nil {
		t.Fatalf("for: %q: %v", alert.For, err)
	}
	want := map[string]bool{"drift/a": true, "drift/b": true, "dead/a": true, "dead/b": true, "zero/a": true, "zero/b": true}
	for at := 120*time.Minute - forDur; at <= 120*time.Minute; at += time.Minute {
		q, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(0, 0).Add(at))
		if err != nil {
			t.Fatal(err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("at %v: %v", at, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, s := range vec {
			got[s.Metric.Get("service")+"/"+s.Metric.Get("endpoint")] = true
		}
		for k := range want {
			if !got[k] {
				t.Errorf("at %v: %s does not fire, want it to (the split diverges)", at, k)
			}
		}
		for k := range got {
			if !want[k] {
				t.Errorf("at %v: %s fires within the noise", at, k)
			}
		}
		q.Close()
	}
}
