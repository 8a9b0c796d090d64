package dataplane

import (
	"bytes"
	"math"
	"net/netip"
	"strings"
	"testing"
)

func ep(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func webView() ServiceView {
	return ServiceView{Service: "demo/web:http", VIP: "198.18.0.10", Port: 80, Protocol: TCP, Entry: EntryClusterIP,
		Backends: []BackendView{{IP: "198.19.1.2", Port: 8080, Share: 10}, {IP: "198.19.1.3", Port: 8080, Share: 90}}}
}

func webCounts(a, b uint64) []EndpointCount {
	return []EndpointCount{
		{Service: "demo/web:http", Protocol: TCP, Endpoint: ep("198.19.1.2:8080"), NewConnections: a},
		{Service: "demo/web:http", Protocol: TCP, Endpoint: ep("198.19.1.3:8080"), NewConnections: b},
	}
}

// The binomial check, against z scores computed by hand: n = 20,000 at
// 10%: mean 2,000, sd sqrt(20000*0.1*0.9) = 42.43.
func TestObserveVerdicts(t *testing.T) {
	for _, c := range []struct {
		name    string
		a, b    uint64
		verdict string
		z       float64
	}{
		{"exact", 2000, 18000, VerdictNoise, 0},
		{"3.5 sigma", 2149, 17851, VerdictNoise, 3.51},   // (2149-2000)/42.43
		{"4.5 sigma", 2191, 17809, VerdictDiverges, 4.5}, // (2191-2000)/42.43
		{"stale rule: 50/50", 10000, 10000, VerdictDiverges, 188.56},
		{"none", 0, 0, VerdictNoData, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Observe([]ServiceView{webView()}, webCounts(c.a, c.b))
			if len(got) != 1 {
				t.Fatalf("%d views, want 1", len(got))
			}
			v := got[0]
			if v.Verdict != c.verdict || v.Total != c.a+c.b {
				t.Errorf("verdict %q total %d, want %q %d", v.Verdict, v.Total, c.verdict, c.a+c.b)
			}
			if math.Abs(v.Backends[0].Sigmas-c.z) > 0.01 || math.Abs(v.Backends[1].Sigmas+c.z) > 0.01 {
				t.Errorf("sigmas %v %v, want %v and %v", v.Backends[0].Sigmas, v.Backends[1].Sigmas, c.z, -c.z)
			}
		})
	}
}

// A reject share is left out of the configured shares (no endpoint counts
// refused connections); a backend at 0% that gets a connection diverges;
// counts of a gone endpoint are reported apart; other entries are skipped.
func TestObserveEdges(t *testing.T) {
	v := webView()
	v.Backends[0].Share, v.Backends[1].Share, v.RejectShare = 5, 45, 50
	got := Observe([]ServiceView{v}, webCounts(100, 900))
	if b := got[0].Backends; b[0].Configured != 10 || b[1].Configured != 90 || got[0].Verdict != VerdictNoise {
		t.Errorf("with a reject share: %+v", got[0])
	}

	v = webView()
	v.Backends[0].Share, v.Backends[1].Share = 0, 100
	if got := Observe([]ServiceView{v}, webCounts(1, 999)); got[0].Verdict != VerdictDiverges {
		t.Errorf("a 0%% backend with a connection: %q, want %q", got[0].Verdict, VerdictDiverges)
	}
	if got := Observe([]ServiceView{v}, webCounts(0, 999)); got[0].Verdict != VerdictNoise {
		t.Errorf("a 0%% backend without connections: %q, want %q", got[0].Verdict, VerdictNoise)
	}

	counts := append(webCounts(10, 90), EndpointCount{Service: "demo/web:http", Protocol: TCP, Endpoint: ep("198.19.1.9:8080"), NewConnections: 7})
	np := webView()
	np.Entry, np.VIP = EntryNodePort, "0.0.0.0"
	got = Observe([]ServiceView{webView(), np}, counts)
	if len(got) != 1 || got[0].Unexpected != 7 || got[0].Total != 100 {
		t.Errorf("gone endpoint and node port entry: %+v", got)
	}
	var buf bytes.Buffer
	if err := WriteObserved(&buf, got, "text"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"demo/web:http 198.18.0.10:80/TCP -> 100 new connections: within expected noise (7 more to endpoints it no longer has)", "198.19.1.2:8080", "observed  10.000%"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestMergeAndSubtractCounts(t *testing.T) {
	merged := MergeCounts(webCounts(1, 2), webCounts(10, 20))
	if len(merged) != 2 || merged[0].NewConnections != 11 || merged[1].NewConnections != 22 {
		t.Errorf("merge: %+v", merged)
	}
	d := SubtractCounts(webCounts(15, 5), webCounts(10, 20))
	// 5 went down from 20: the endpoint came back, its counter restarted.
	if d[0].NewConnections != 5 || d[1].NewConnections != 5 {
		t.Errorf("subtract: %+v", d)
	}
}
