package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
)

// TestAppendPoint checks the points k8s-bench adds to the growth figure:
// measured runs only, the proxy's name marked as an API-server run, the
// change percentiles in seconds, appended run after run.
func TestAppendPoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), "points.jsonl")
	cfg := &config{runID: "r1", commit: "abc1234"}
	lat := make([]time.Duration, 100)
	for i := range lat {
		lat[i] = time.Duration(i+1) * time.Millisecond
	}
	runs := []result{
		{proxy: proxy{name: proxySteelyardNFTables}, services: 10000, endpoints: 10, cpuChanges: 5, cpuTotal: 20, syncMeasured: true, firstSync: 14 * time.Second,
			rssKiB: 300 * 1024, latencies: lat, cpuMeasured: true, cpuSync: 13.5},
		{proxy: proxy{name: proxyKubeProxyNFTables}, services: 30000, endpoints: 10, syncMeasured: true, firstSyncErr: "timeout (> 15m)"},
		{proxy: proxy{name: proxyKubeProxyNFTables}, services: 1000, endpoints: 10, fail: "crashed"},
		{proxy: proxy{name: proxySteelyard, flavour: "legacy", minSync: "1s"}, services: 1000, endpoints: 100, explainWall: 0.5, explainCPU: 0.4, explainCmd: "steelyard explain --mode iptables", syncMeasured: true, firstSync: time.Second},
	}
	for _, r := range runs {
		if err := appendPoint(path, cfg, r); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []point.Result
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var p point.Result
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	if len(got) != 2 {
		t.Fatalf("%d points, want 2 (runs without a first sync are left out): %+v", len(got), got)
	}
	p := got[0]
	if p.Dataplane != "steelyard nftables (API server)" || p.Services != 10000 || p.First != 14 || p.RSSMiB != 300 ||
		p.FirstCPU != 13.5 || p.ChangeP50 != 0.050 || p.ChangeP99 != 0.099 {
		t.Errorf("point %+v", p)
	}
	if p.RunID != "r1" || p.Proxy != "steelyard-nftables" || p.MinSyncPeriod != "250ms" || p.Changes != 100 ||
		p.ChangeCPU != 0.05 || p.TotalCPU != 20 || p.Endpoints != 10 {
		t.Errorf("point %+v", p)
	}
	// Every new point names its run: the commit (or "unknown"), the date.
	if p.Commit == "" || p.Date == "" {
		t.Errorf("point without commit or date: %+v", p)
	}
	if got[1].Dataplane != "steelyard (iptables) --min-sync-period 1s legacy (API server)" || got[1].ChangeP99 != 0 ||
		got[1].Proxy != "steelyard-msp1s" || got[1].MinSyncPeriod != "1s" || got[1].Endpoints != 100 ||
		got[1].Explain != 0.5 || got[1].ExplainCPU != 0.4 || got[1].ExplainCmd != "steelyard explain --mode iptables" || got[1].Changes != 0 {
		t.Errorf("point %+v", got[1])
	}
}
