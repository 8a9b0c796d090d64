//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

func caseEstablishedConnectionSurvivesRestartAndDrain(t *testing.T, m dpMode) {
	even := webService
	even.annotations = map[string]string{"steelyard.io/weights": "web-1=1,web-2=1"}
	f := newFixture(t, m)
	f.addPods(even)
	f.write("web.yaml", even)
	f.start()

	c, err := f.client.Connect(addrPort(even.vip, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("long-lived connection %s -> %s landed on %s", c.LocalAddr(), c.RemoteAddr(), c.Backend)
	echo := func(when string) {
		t.Helper()
		if err := c.Echo("still there "+when, 2*time.Second); err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	echo("before anything")

	// Restart: SIGTERM leaves the rules (and conntrack) in place.
	if err := f.agent.Stop(); err != nil {
		t.Errorf("agent exit on SIGTERM: %v (want status 0)", err)
	}
	echo("with the agent stopped")
	if out, code := f.verify(); code != 0 {
		t.Errorf("rules did not survive SIGTERM: verify exit %d:\n%s", code, out)
	}
	f.start()
	echo("after the agent restarted")

	// Drain the connection's backend to weight 0.
	other := map[string]string{"web-1": "web-2", "web-2": "web-1"}[c.Backend]
	if other == "" {
		t.Fatalf("unexpected backend %q", c.Backend)
	}
	drained := even
	drained.annotations = map[string]string{"steelyard.io/weights": c.Backend + "=0," + other + "=1"}
	f.write("web.yaml", drained)
	f.waitVerify(5 * time.Second)
	echo("after its backend was drained to weight 0")

	r, err := f.client.TCPConns(addrPort(even.vip, 80), 500, sandbox.Load{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new connections after the drain: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{other: 100}, 0)
	echo("at the end")
}

func caseRejectWithoutEndpoints(t *testing.T, m dpMode) {
	empty := svc{
		name: "empty", vip: "198.18.0.14", port: 80, targetPort: 8080,
		extraPorts: []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)}},
	}
	f := newFixture(t, m)
	f.write("empty.yaml", empty)
	f.start()

	text, err := f.steelyard(append([]string{"explain"}, f.modeArgs()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("explain:\n%s", text)
	for _, port := range []uint16{80, 53} {
		if v := viewcheck.Find(f.explain(), empty.vip, port); v == nil || !v.Reject {
			t.Errorf("explain %s:%d: %+v, want reject", empty.vip, port, v)
		}
	}
	if !strings.Contains(text, "reject (no endpoints)") {
		t.Errorf("explain text lacks %q", "reject (no endpoints)")
	}

	from := map[string]*sandbox.NS{"client": f.client, "node": f.sb.Node}
	for _, origin := range []string{"client", "node"} {
		for _, c := range []struct {
			proto string
			port  uint16
		}{{"tcp", 80}, {"udp", 53}} {
			took, err := from[origin].Dial(c.proto, addrPort(empty.vip, int32(c.port)), time.Second)
			t.Logf("%s from the %s: %v after %s", c.proto, origin, err, took.Round(time.Microsecond))
			refused := errors.Is(err, syscall.ECONNREFUSED)
			if origin == "node" && c.proto == "udp" {
				// A REJECT in OUTPUT drops the node's own datagram inside
				// sendmsg, which then fails with EPERM (as with kube-proxy).
				refused = refused || errors.Is(err, syscall.EPERM)
			}
			if !refused {
				t.Errorf("%s from the %s to %s:%d: %v, want ECONNREFUSED", c.proto, origin, empty.vip, c.port, err)
			} else if took > 100*time.Millisecond {
				t.Errorf("%s from the %s: refused after %s, want within 100ms", c.proto, origin, took)
			}
		}
	}
}

func caseHairpin(t *testing.T, m dpMode) {
	self := svc{
		name: "self", vip: "198.18.0.15", port: 80, targetPort: 8080,
		endpoints: []pod{{"self-1", "198.19.5.2"}},
	}
	f := newFixture(t, m)
	f.addPods(self)
	f.write("self.yaml", self)
	f.start()

	p := f.sb.Pod("self-1")
	r, err := p.NS.TCPConns(addrPort(self.vip, 80), 100, sandbox.Load{Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod -> own VIP: %s", r)
	sandbox.ExpectShares(t, r, map[string]float64{"self-1": 100}, 0)

	c, err := p.NS.Connect(addrPort(self.vip, 80), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Echo("hairpin", time.Second); err != nil {
		t.Error(err)
	}
}

func caseResyncOnFileChange(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(webService)
	f.write("web.yaml", webService)
	f.start()

	change := func(how string, weights string, want map[string]float64, write func()) {
		t.Helper()
		start := time.Now()
		write()
		for {
			got := viewcheck.Shares(viewcheck.Find(f.explain(), webService.vip, 80))
			if viewcheck.Same(got, want) {
				took := time.Since(start)
				t.Logf("%s (%s): explain shows %v after %s", how, weights, got, took.Round(time.Millisecond))
				// The agent promises 1 s; explain polling adds up to ~0.1 s.
				if took > 1500*time.Millisecond {
					t.Errorf("%s: re-sync took %s, want about 1s", how, took)
				}
				return
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: explain still shows %v 5s after the change, want %v", how, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	half := webService
	half.annotations = map[string]string{"steelyard.io/weights": "web-1=1,web-2=1"}
	change("file rewritten in place", "1:1", map[string]float64{"198.19.1.2": 50, "198.19.1.3": 50}, func() {
		f.write("web.yaml", half)
	})

	quarter := webService
	quarter.annotations = map[string]string{"steelyard.io/weights": "web-1=3,web-2=1"}
	change("file replaced by rename", "3:1", map[string]float64{"198.19.1.2": 75, "198.19.1.3": 25}, func() {
		f.write(".web.yaml.tmp", quarter)
		if err := os.Rename(filepath.Join(f.dir, ".web.yaml.tmp"), filepath.Join(f.dir, "web.yaml")); err != nil {
			t.Fatal(err)
		}
	})
}

func caseExplainVerifyAndRepair(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	// Without --cluster-cidr the Service chain holds only endpoint rules,
	// so rule 1 is the 10% endpoint's.
	f.noClusterCIDR = true
	f.addPods(webService)
	f.write("web.yaml", webService)
	// Hand edits are repaired by full syncs: make them as frequent as the
	// periodic ones (canary_test.go covers the default hour).
	f.start("--sync-period", "1s", "--full-sync-period", "1s")

	text, err := f.steelyard(append([]string{"explain"}, f.modeArgs()...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("explain:\n%s", text)
	line := ""
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "198.18.0.10:80/TCP") {
			line = l
		}
	}
	for _, want := range []string{"198.19.1.2:8080 10.00%", "198.19.1.3:8080 90.00%", "e2e/web:tcp"} {
		if !strings.Contains(line, want) {
			t.Errorf("explain line %q lacks %q", line, want)
		}
	}
	if out, code := f.verify(); code != 0 {
		t.Fatalf("verify: exit %d:\n%s", code, out)
	}
	if m.flavour == "" { // nftables: the same faults, made with nft
		repairNft(t, f)
		return
	}

	save, err := f.sb.Node.Exec(iptablesCmd(f.m.flavour, "iptables-save"), "-t", "nat")
	if err != nil {
		t.Fatal(err)
	}
	match := regexp.MustCompile(`-A STEELYARD-SERVICES .*"e2e/web:tcp".* -j (STEELYARD-SVC-[A-Z0-9]+)`).FindStringSubmatch(save)
	if match == nil {
		t.Fatalf("no Service chain for e2e/web:tcp in:\n%s", save)
	}
	chain := match[1]
	rules, err := f.sb.Node.Exec(iptablesCmd(f.m.flavour, "iptables"), "-t", "nat", "-S", chain)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s before:\n%s", chain, rules)

	// The agent re-syncs every second, so it may repair the rule before
	// verify runs; try a few times to catch the broken state.
	var out string
	code := 0
	for try := 1; try <= 5 && code == 0; try++ {
		if _, err := f.sb.Node.Exec(iptablesCmd(f.m.flavour, "iptables"), "-t", "nat", "-D", chain, "1"); err != nil {
			t.Fatal(err)
		}
		out, code = f.verify()
	}
	t.Logf("verify after `iptables -t nat -D %s 1`: exit %d:\n%s", chain, code, out)
	if code != 1 {
		t.Fatalf("verify exit %d after a rule was deleted, want 1", code)
	}
	if !strings.Contains(out, "198.18.0.10:80/TCP") {
		t.Errorf("verify output does not name the broken VIP")
	}

	start := time.Now()
	f.waitVerify(5 * time.Second)
	t.Logf("repaired by the periodic sync after %s", time.Since(start).Round(time.Millisecond))

	// Breaking masquerading does not change any share, but it breaks
	// hairpin connections: verify must notice that too.
	code = 0
	for try := 1; try <= 5 && code == 0; try++ {
		if _, err := f.sb.Node.Exec(iptablesCmd(f.m.flavour, "iptables"), "-t", "nat", "-F", "STEELYARD-POSTROUTING"); err != nil {
			t.Fatal(err)
		}
		out, code = f.verify()
	}
	t.Logf("verify after `iptables -t nat -F STEELYARD-POSTROUTING`: exit %d:\n%s", code, out)
	if code != 1 || !strings.Contains(out, "hairpin") {
		t.Fatalf("verify exit %d after masquerading was flushed, want 1 with a hairpin problem", code)
	}
	f.waitVerify(5 * time.Second)
}

func caseCleanupRemovesOnlySteelyard(t *testing.T, m dpMode) {
	f := newFixture(t, m)
	f.addPods(webService)
	f.write("web.yaml", webService)

	// Someone else's rules, where the agent writes its own.
	f.m.addForeign(t, f)
	before := f.m.ruleset(t, f)

	f.start()
	if err := f.agent.Stop(); err != nil {
		t.Errorf("agent exit on SIGTERM: %v", err)
	}
	during := f.m.ruleset(t, f)
	if !strings.Contains(strings.Join(during, "\n"), f.m.marker()) {
		t.Fatalf("no %s rules left after SIGTERM (they should stay)", f.m.marker())
	}

	if out, err := f.steelyard(append([]string{"cleanup"}, f.modeArgs()...)...); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}
	after := f.m.ruleset(t, f)
	if diff := diffLines(before, after); diff != "" {
		t.Errorf("rules after cleanup differ from before the agent ran:\n%s", diff)
	}
	if f.m.flavour != "" {
		for _, flavour := range []string{"nft", "legacy"} {
			out, err := f.sb.Node.Exec(iptablesCmd(flavour, "iptables-save"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(out, "STEELYARD") {
				t.Errorf("iptables-%s-save still shows STEELYARD after cleanup:\n%s", flavour, out)
			}
		}
	}
	if v := f.explain(); len(v) != 0 {
		t.Errorf("explain after cleanup: %v", v)
	}
	t.Logf("cleanup kept the %d foreign lines and removed %d of steelyard's", len(after), len(during)-len(after))

	// Idempotent: a second cleanup is fine.
	if out, err := f.steelyard(append([]string{"cleanup"}, f.modeArgs()...)...); err != nil {
		t.Errorf("second cleanup: %v\n%s", err, out)
	}
}

// addForeign writes someone else's rules where the mode writes its own:
// chains and jumps in both iptables tables, or a neighbour nft table.
func (m dpMode) addForeign(t *testing.T, f *fixture) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if _, err := f.sb.Node.Exec(args...); err != nil {
			t.Fatal(err)
		}
	}
	if m.flavour == "" {
		run("nft", "add table ip neighbour")
		run("nft", "add chain ip neighbour prerouting { type nat hook prerouting priority dstnat ; }")
		run("nft", "add rule ip neighbour prerouting ip daddr 198.18.1.1 return")
		return
	}
	ipt := iptablesCmd(m.flavour, "iptables")
	run(ipt, "-t", "nat", "-N", "FOREIGN-NAT")
	run(ipt, "-t", "nat", "-A", "FOREIGN-NAT", "-d", "198.18.1.1/32", "-j", "RETURN")
	run(ipt, "-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "foreign", "-j", "FOREIGN-NAT")
	run(ipt, "-t", "nat", "-A", "POSTROUTING", "-s", "198.19.200.0/24", "-j", "MASQUERADE")
	run(ipt, "-t", "filter", "-A", "FORWARD", "-d", "198.18.1.2/32", "-m", "comment", "--comment", "foreign", "-j", "ACCEPT")
}

// marker is what the mode's own rules show in ruleset.
func (m dpMode) marker() string {
	if m.flavour == "" {
		return "table ip steelyard"
	}
	return "STEELYARD-"
}

// ruleset returns the mode's kernel rules of the node namespace, one
// normalised line each, sorted: iptables-save lines of the flavour, or
// the whole `nft list ruleset`.
func (m dpMode) ruleset(t *testing.T, f *fixture) []string {
	t.Helper()
	if m.flavour != "" {
		return f.rules(m.flavour)
	}
	out, err := f.sb.Node.Exec("nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" && l != "}" {
			lines = append(lines, l)
		}
	}
	sort.Strings(lines)
	return lines
}

// rules returns the rules and user chains of the node namespace
// ("table: line"), without counters, comments and built-in chain policies,
// sorted.
func (f *fixture) rules(mode string) []string {
	f.t.Helper()
	out, err := f.sb.Node.Exec(iptablesCmd(mode, "iptables-save"))
	if err != nil {
		f.t.Fatal(err)
	}
	var lines []string
	table := ""
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
		case strings.HasPrefix(l, "-A "):
			lines = append(lines, table+": "+l)
		case strings.HasPrefix(l, ":"):
			// ":CHAIN POLICY [counters]"; user chains have policy "-".
			if fields := strings.Fields(l); len(fields) >= 2 && fields[1] == "-" {
				lines = append(lines, table+": "+fields[0])
			}
		}
	}
	sort.Strings(lines)
	return lines
}

// diffLines returns "- line" for lines only in a and "+ line" for lines only in b.
func diffLines(a, b []string) string {
	count := map[string]int{}
	for _, l := range a {
		count[l]++
	}
	for _, l := range b {
		count[l]--
	}
	var out []string
	for l, n := range count {
		switch {
		case n > 0:
			out = append(out, fmt.Sprintf("- %s", l))
		case n < 0:
			out = append(out, fmt.Sprintf("+ %s", l))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// repairNft breaks the nftables table by hand as the iptables branch of
// caseExplainVerifyAndRepair does (the VIP's element of the service-ips
// map, then the masquerading chain): verify reports each fault and the
// next full sync repairs it.
func repairNft(t *testing.T, f *fixture) {
	t.Helper()
	for _, fault := range []struct {
		what string
		cmd  []string
		// want is in verify's output while the fault is there.
		want string
	}{
		{"the VIP's service-ips element deleted", []string{"nft", "delete", "element", "ip", "steelyard", "service-ips", "{ 198.18.0.10 . tcp . 80 }"}, "198.18.0.10:80/TCP"},
		{"the masquerading chain flushed", []string{"nft", "flush", "chain", "ip", "steelyard", "masquerading"}, "hairpin"},
	} {
		// The agent re-syncs every second: try a few times to catch the
		// broken state.
		var out string
		code := 0
		for try := 1; try <= 5 && code == 0; try++ {
			if _, err := f.sb.Node.Exec(fault.cmd...); err != nil {
				if try == 1 {
					t.Fatalf("%s: %v", fault.what, err)
				}
				continue // repaired and broken again in between: retry
			}
			out, code = f.verify()
		}
		t.Logf("verify after %s: exit %d:\n%s", fault.what, code, out)
		if code != 1 {
			t.Fatalf("verify exit %d after %s, want 1", code, fault.what)
		}
		if !strings.Contains(out, fault.want) {
			t.Errorf("verify output after %s does not name %q", fault.what, fault.want)
		}
		start := time.Now()
		f.waitVerify(5 * time.Second)
		t.Logf("%s: repaired by the full sync after %s", fault.what, time.Since(start).Round(time.Millisecond))
	}
}
