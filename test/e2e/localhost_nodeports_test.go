//go:build e2e

package e2e

// Localhost node ports (--localhost-nodeports, on by default as kube-proxy's
// iptables mode has them): the regression test of Kubernetes'
// "[sig-network] LocalhostNodePorts should honor sessionAffinity=ClientIP
// for localhost NodePort" and "KubeProxy should update metric for tracking
// accepted packets destined for localhost nodeports", which failed for
// steelyard in make conformance (docs/conformance.md).
//
// IP plan: Services 198.18.0.40 and .41, pods 198.19.28.x.

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// loopbackConns opens count TCP connections from ns to 127.0.0.1:port (the
// sandbox's own clients take only its ranges) and counts the first word of
// each first line; lines ending in 127.0.0.1 (a pod that saw a loopback
// source) are counted under "unmasqueraded".
func loopbackConns(t *testing.T, ns *sandbox.NS, port uint16, count int) map[string]int {
	t.Helper()
	got := map[string]int{}
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		for range count {
			c, err := d.Dial("tcp4", "127.0.0.1:"+strconv.Itoa(int(port)))
			if err != nil {
				got["error: "+errorClassOf(err)]++
				continue
			}
			c.(*net.TCPConn).SetLinger(0)
			c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				got["error: "+errorClassOf(err)]++
				continue
			}
			name, src, _ := strings.Cut(strings.TrimSpace(line), " ")
			if src == "127.0.0.1" {
				name = "unmasqueraded"
			}
			got[name]++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func errorClassOf(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH):
		return "timeout"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

// kubeProxyCompat is the agent's kube-proxy compatible endpoint in this test.
const kubeProxyCompat = "127.0.0.1:10249"

func caseLocalhostNodePort(t *testing.T, m dpMode) {
	spread := pService{
		name: "lnp", clusterIPs: []string{"198.18.0.40"}, port: 80, targetPort: 8080, weights: "lnp-1=30,lnp-2=70",
		endpoints: []pEndpoint{{name: "lnp-1", ip: "198.19.28.2"}, {name: "lnp-2", ip: "198.19.28.3", node: "other-node"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30090
		},
	}
	sticky := pService{
		name: "lnp-aff", clusterIPs: []string{"198.18.0.41"}, port: 80, targetPort: 8080,
		endpoints: []pEndpoint{{name: "lnp-a", ip: "198.19.28.4"}, {name: "lnp-b", ip: "198.19.28.5"}, {name: "lnp-c", ip: "198.19.28.6"}},
		tweak: func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30091
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			sec := int32(10800) // the upstream test's
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
		},
	}
	f := newFixture(t, m)
	f.addSourcePods(spread, sticky)
	f.writeParity("lnp.yaml", spread, sticky)
	f.start("--kube-proxy-metrics-bind-address", kubeProxyCompat)

	if v, err := f.sb.Node.ReadSysctl("net/ipv4/conf/all/route_localnet"); err != nil || v != "1" {
		t.Fatalf("route_localnet in the node namespace = %q (%v), want 1", v, err)
	}

	// 1,000 at 30/70: sigma 1.45 points; 7 points = 4.8 sigma.
	got := loopbackConns(t, f.sb.Node, 30090, 1000)
	t.Logf("127.0.0.1:30090 from the node: %v", got)
	if n := got["lnp-1"] + got["lnp-2"]; n != 1000 {
		t.Errorf("127.0.0.1:30090: %d of 1000 reached a backend (masqueraded): %v", n, got)
	} else if share := 100 * float64(got["lnp-1"]) / 1000; share < 23 || share > 37 {
		t.Errorf("127.0.0.1:30090: lnp-1 got %.1f%%, want 30 +- 7", share)
	}

	// ClientIP affinity: every connection from 127.0.0.1 to one backend,
	// as the upstream test's checkAffinity wants.
	got = loopbackConns(t, f.sb.Node, 30091, 100)
	t.Logf("127.0.0.1:30091 (ClientIP) from the node: %v", got)
	if len(got) != 1 || got["unmasqueraded"] > 0 || strings.HasPrefix(firstKey(got), "error") {
		t.Errorf("127.0.0.1:30091 with ClientIP affinity reached %v, want one backend for all 100", got)
	}

	// The kube-proxy compatible endpoint: the mode, and in iptables mode
	// the nfacct counter (the first packet of each connection above).
	_, mode, err := f.sb.Node.HTTPGet("http://"+kubeProxyCompat+"/proxyMode", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wantMode := "iptables"
	if m.flavour == "" {
		wantMode = m.name // nftables, ebpf
	}
	if mode != wantMode {
		t.Errorf("/proxyMode = %q, want %q", mode, wantMode)
	}
	_, metrics, err := f.sb.Node.HTTPGet("http://"+kubeProxyCompat+"/metrics", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	count, ok := metricValue(metrics, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total")
	t.Logf("kubeproxy_iptables_localhost_nodeports_accepted_packets_total: %v (present %v)", count, ok)
	switch {
	case wantMode == "iptables" && (!ok || count < 1100):
		t.Errorf("iptables mode: accepted localhost node port packets %v (present %v), want >= 1100 (one per connection)", count, ok)
	case m.flavour == "" && ok:
		t.Errorf("%s mode exports the iptables counter (%v)", m.name, count)
	}

	martianDropped(t, f, m)
}

// martianDropped sends, from a client on the LAN, packets to 127.0.0.1
// (policy routing in the client sends them to the node): a server on the
// node's 127.0.0.1 and a node port must not answer, although the node's
// route_localnet=1 would let the kernel accept them (CVE-2020-8558). Then
// it removes steelyard's drop rule and shows that the same connection
// goes through: the rule, not routing, dropped it.
func martianDropped(t *testing.T, f *fixture, m dpMode) {
	t.Helper()
	c := f.client
	for _, cmd := range [][]string{
		{"ip", "rule", "add", "pref", "100", "lookup", "local"},
		{"ip", "rule", "del", "pref", "0"},
		{"ip", "rule", "add", "pref", "10", "to", "127.0.0.1/32", "lookup", "100"},
		{"ip", "route", "add", "127.0.0.1/32", "via", sandbox.NodeLANIP.String(), "table", "100"},
	} {
		if out, err := c.Exec(cmd...); err != nil {
			t.Fatalf("%v: %v %s", cmd, err, out)
		}
	}
	// The node's answers come from 127.0.0.1; the client takes them only so.
	if err := c.WriteSysctl("net/ipv4/conf/all/route_localnet", "1"); err != nil {
		t.Fatal(err)
	}
	var l net.Listener
	if err := f.sb.Node.Do(func() error {
		var err error
		l, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("node-loopback 0\n"))
			conn.Close()
		}
	}()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	for _, p := range []uint16{port, 30090} {
		got := loopbackConns(t, c, p, 3)
		t.Logf("127.0.0.1:%d from the LAN client: %v", p, got)
		if got["error: timeout"] != 3 {
			t.Errorf("127.0.0.1:%d from another host: %v, want 3 dropped (timeouts)", p, got)
		}
	}
	flush := []string{"nft", "flush", "chain", "ip", "steelyard", "localnet-input"}
	if m.flavour != "" {
		flush = []string{iptablesCmd(m.flavour, "iptables"), "-F", "STEELYARD-FIREWALL"}
	}
	if out, err := f.sb.Node.Exec(flush...); err != nil {
		t.Fatalf("%v: %v %s", flush, err, out)
	}
	got := loopbackConns(t, c, port, 1)
	t.Logf("127.0.0.1:%d from the LAN client without the drop rule: %v", port, got)
	if got["node-loopback"] != 1 {
		t.Errorf("without steelyard's drop rule the node's 127.0.0.1 server should answer (route_localnet=1): %v", got)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}

// metricValue returns the value of an unlabelled metric in a Prometheus
// text exposition.
func metricValue(text, name string) (float64, bool) {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}
