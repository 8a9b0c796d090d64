package controller

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/steelyard-net/steelyard/dataplane/iptables"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, string(body)
}

func TestHealthReadyAfterFirstSyncStaleWhenSyncsStop(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h := NewHealth(time.Minute, clk)
	if code, _ := get(t, h.Handler(), "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz before the first sync: %d", code)
	}
	if code, _ := get(t, h.Handler(), "/healthz"); code != http.StatusOK {
		t.Errorf("healthz while starting: %d", code)
	}
	h.Synced()
	if code, _ := get(t, h.Handler(), "/readyz"); code != http.StatusOK {
		t.Errorf("readyz after a sync: %d", code)
	}
	clk.Step(61 * time.Second)
	if code, body := get(t, h.Handler(), "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stale") {
		t.Errorf("healthz with no sync for 61s: %d %q", code, body)
	}
}

func TestAgentExportsSyncMetrics(t *testing.T) {
	m := NewMetrics()
	tr := NewChangeTracker()
	m.WatchTracker(tr)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	a := &Agent{Source: &staticSource{}, Tracker: tr, Builder: NewBuilder(), Dataplane: iptables.NewProxier(iptables.NewFake(), iptables.Config{}),
		FullSyncPeriod: time.Minute, Clock: clk, Metrics: m, Health: NewHealth(time.Minute, clk)}
	tr.ServiceChanged(nil, makeService("demo", "web", nil))
	if err := a.Sync(); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, m.Handler(), "/metrics")
	for _, want := range []string{
		"steelyard_sync_full_proxy_rules_duration_seconds_count 1",
		"steelyard_sync_proxy_rules_service_changes_total 1",
		"steelyard_sync_proxy_rules_service_changes_pending 0",
		"steelyard_sync_proxy_rules_last_timestamp_seconds 1000",
		"steelyard_programmed_services 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// ReadyC closes on the first successful sync, not before, and a later sync
// does not close it twice.
func TestHealthReadyC(t *testing.T) {
	h := NewHealth(time.Minute, nil)
	select {
	case <-h.ReadyC():
		t.Fatal("ready before any sync")
	default:
	}
	h.Synced()
	h.Synced()
	select {
	case <-h.ReadyC():
	default:
		t.Fatal("not ready after a successful sync")
	}
}

// The kube-proxy shaped /healthz: 200 with "lastUpdated": <last sync>
// (kube-proxy's format, as the e2e test matches it), 503 when stale.
func TestKubeProxyHealthHandler(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 3, 0, 0, 0, time.UTC))
	h := NewHealth(time.Minute, clk)
	clk.Step(5 * time.Second)
	h.Synced()
	clk.Step(10 * time.Second)
	for _, path := range []string{"/healthz", "/livez"} {
		code, body := get(t, KubeProxyHealthHandler(h), path)
		want := `{"lastUpdated": "2026-12-07T03:00:05Z", "currentTime": "2026-12-07T03:00:15Z"}`
		if code != http.StatusOK || body != want {
			t.Errorf("%s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	clk.Step(61 * time.Second)
	if code, body := get(t, KubeProxyHealthHandler(h), "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, `"lastUpdated": "2026-12-07T03:00:05Z"`) {
		t.Errorf("stale: %d %q", code, body)
	}
}
