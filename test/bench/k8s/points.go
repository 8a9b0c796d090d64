package main

import (
	"encoding/json"
	"os"

	"github.com/steelyard-net/steelyard/test/bench/scale/point"
	"github.com/steelyard-net/steelyard/test/runinfo"
)

// toPoint is r as one point of scale-plot's growth figure: the first full
// sync, peak RSS and the endpoint change -> kernel p50 and p99, under the
// proxy's name and "(API server)", so the figure draws kube-proxy beside
// steelyard's dataplanes. ok is false for a run without a first sync.
func toPoint(cfg *config, r result) (p point.Result, ok bool) {
	if r.fail != "" || !r.syncMeasured || r.firstSyncErr != "" {
		return p, false
	}
	name := r.proxy.label()
	if r.proxy.flavour != "" {
		name += " " + r.proxy.flavour
	}
	p = point.Result{
		Dataplane: name + " (API server)",
		Services:  r.services,
		Endpoints: r.endpoints,
		First:     r.firstSync.Seconds(),
		RSSMiB:    float64(r.rssKiB) / 1024,
		LoadAvg:   runinfo.LoadAvg(),
		Commit:    cfg.commit,
		Date:      runinfo.Date(),
	}
	if r.cpuMeasured {
		p.FirstCPU = r.cpuSync
	}
	p.RunID, p.Proxy, p.MinSyncPeriod = cfg.runID, r.proxy.id(), r.proxy.minSyncPeriod()
	p.TotalCPU, p.MapsMemlock, p.LoadSeconds = r.cpuTotal, r.mapsMemlock, r.loadTime.Seconds()
	if r.explainErr == "" && r.explainWall > 0 {
		p.Explain, p.ExplainCPU, p.ExplainCmd = r.explainWall, r.explainCPU, r.explainCmd
	}
	// Percentiles of a complete set of changes only: a run cut short
	// would report the fast part.
	if len(r.latencies) > 0 && r.changesErr == "" {
		p.Changes = len(r.latencies)
		p.ChangeP50 = percentile(r.latencies, 0.5).Seconds()
		p.ChangeP99 = percentile(r.latencies, 0.99).Seconds()
		p.ChangeCPU = r.cpuChanges / float64(len(r.latencies))
	}
	r.traffic.fill(&p)
	return p, true
}

// appendPoint appends r's point to the file path (nothing when path is
// empty or r has no first sync). The plot keeps the last point of each
// proxy and size, so runs of other sizes add up in one file.
func appendPoint(path string, cfg *config, r result) error {
	p, ok := toPoint(cfg, r)
	if path == "" || !ok {
		return nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
