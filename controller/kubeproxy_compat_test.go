package controller

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func fetch(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d", path, rec.Code)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// What Kubernetes' e2e test reads: curl 127.0.0.1:10249/proxyMode, then the
// counter from /metrics (a Prometheus text counter without labels).
func TestKubeProxyCompatHandler(t *testing.T) {
	var packets uint64 = 7
	kept := true
	h := KubeProxyCompatHandler("iptables", func() (uint64, bool) { return packets, kept })
	if got := fetch(t, h, "/proxyMode"); got != "iptables" {
		t.Errorf("/proxyMode = %q", got)
	}
	read := func() (float64, bool) {
		text := fetch(t, h, "/metrics")
		if strings.Contains(text, kubeProxyLocalhostAcceptedMetric) && !strings.Contains(text, "# TYPE "+kubeProxyLocalhostAcceptedMetric+" counter") {
			t.Errorf("not a counter:\n%s", text)
		}
		for _, l := range strings.Split(text, "\n") {
			if v, ok := strings.CutPrefix(l, kubeProxyLocalhostAcceptedMetric+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				return f, err == nil
			}
		}
		return 0, false
	}
	if v, ok := read(); !ok || v != 7 {
		t.Errorf("counter %v (present %v), want 7", v, ok)
	}
	packets = 1107
	if v, _ := read(); v != 1107 {
		t.Errorf("counter %v after more packets, want 1107 (read at scrape time)", v)
	}
	kept = false
	if v, ok := read(); ok {
		t.Errorf("counter %v exported while the dataplane keeps none", v)
	}
	if got := fetch(t, KubeProxyCompatHandler("nftables", func() (uint64, bool) { return 0, false }), "/proxyMode"); got != "nftables" {
		t.Errorf("/proxyMode in nftables mode = %q", got)
	}
}
