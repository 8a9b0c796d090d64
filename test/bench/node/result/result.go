// Package result is what node-bench measures and node-plot reads: one JSON
// document with the rate probe and the four runs (VIP or pod upstreams,
// steady or under scale churn), each with its latency over time and the
// times of its scale events, EndpointSlice changes and nginx reloads.
package result

// Report is one `make bench-node`.
type Report struct {
	// Date is when the benchmark started (RFC 3339, UTC).
	Date string `json:"date"`
	// Commit is the commit node-bench was built from (runinfo.Commit;
	// absent in reports from before 2026-12-04).
	Commit string `json:"commit,omitempty"`
	// CPUs is the machine's CPU count; other work on it shows in LoadAvg.
	CPUs int `json:"cpus"`
	// Rate is the constant request rate of every run (requests/s).
	Rate int `json:"rate"`
	// Probe holds the short steady runs that chose Rate.
	Probe []Step `json:"probe"`
	// Seconds is the length of each run.
	Seconds float64 `json:"seconds"`
	// Bucket is the width of a Series point in seconds.
	Bucket float64 `json:"bucket"`
	// PreStopSeconds is the backends' preStop pause (0 in older reports).
	PreStopSeconds float64 `json:"prestop_seconds,omitempty"`
	// NoLivenessProbe is set when the DaemonSet ran without its liveness
	// probe, in every run of the report: the frozen phase stops the agent,
	// which kubelet would otherwise restart (nginx with it).
	NoLivenessProbe bool  `json:"no_liveness_probe,omitempty"`
	Runs            []Run `json:"runs"`
}

// Step is one rate of the probe.
type Step struct {
	Rate     int     `json:"rate"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	// Behind is how late the sender issued its last request (ms): a
	// sender that cannot keep up is a saturated machine, whatever nginx
	// answers.
	Behind  float64 `json:"behind_ms"`
	OK      bool    `json:"ok"`
	LoadAvg string  `json:"loadavg"`
}

// Run is one of the four runs.
type Run struct {
	// Upstreams is "vip" or "pods" (--ingress-upstreams).
	Upstreams string `json:"upstreams"`
	// Phase is "steady" (5 replicas throughout), "churn" (5 <-> 7),
	// "bystander" (the backends steady while a Deployment behind no
	// Service scales 5 <-> 7 on the same node: the control for churn) or
	// "frozen" (churn with steelyard's agent stopped once its rules held
	// the 5 backends: the kernel's rules and nginx's upstreams stay as
	// they were while the node creates and deletes the 2 extra pods, so
	// its tail is the node's and the difference to churn steelyard's).
	Phase string `json:"phase"`
	// FrozenKept is, for a frozen run, how many of the 5 backends in the
	// frozen rules still ran at its end (5: no request went to a deleted
	// pod because of the freeze).
	FrozenKept int            `json:"frozen_kept,omitempty"`
	Requests   int            `json:"requests"`
	Errors     int            `json:"errors"`
	ErrClasses map[string]int `json:"error_classes,omitempty"`
	// Reloads counts nginx reloads during the run (the agent's metric).
	Reloads int `json:"reloads"`
	// Syncs counts the agent's kernel syncs (rule writes) during the run,
	// SyncMeanMS their mean duration.
	Syncs      int     `json:"syncs"`
	SyncMeanMS float64 `json:"sync_mean_ms"`
	// Latency percentiles over every request, from its due time (ms).
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15 minute figures at the end.
	LoadAvg string `json:"loadavg"`
	// CPUBusy is the machine's mean CPU use during the run (0-100 %).
	CPUBusy float64 `json:"cpu_busy_pct"`
	// CPUSeconds splits the CPU time the machine used during the run.
	CPUSeconds CPUSplit `json:"cpu_seconds"`
	// NginxErrors counts nginx's upstream error-log lines by cause
	// ("Connection refused", "upstream prematurely closed connection", ...).
	NginxErrors map[string]int `json:"nginx_errors,omitempty"`
	// Series is the latency over time, one point per Bucket seconds.
	Series []Point `json:"series"`
	// Times, in seconds since the run's start.
	Scales       []Event   `json:"scales,omitempty"`
	SliceChanges []float64 `json:"slice_changes,omitempty"`
	ReloadTimes  []float64 `json:"reload_times,omitempty"`
	SyncTimes    []float64 `json:"sync_times,omitempty"`
	// Slow counts requests of at least SlowMS; the Near fields count those
	// due within one second after a scale event, an EndpointSlice change, a
	// reload or a kernel sync (a request may count in several): where the tail comes from.
	SlowMS         float64 `json:"slow_ms"`
	Slow           int     `json:"slow"`
	SlowNearScale  int     `json:"slow_near_scale"`
	SlowNearSlice  int     `json:"slow_near_slice"`
	SlowNearReload int     `json:"slow_near_reload"`
	SlowNearSync   int     `json:"slow_near_sync"`
	// SlowBusy counts slow requests due in a bucket whose CPU use was at
	// least 90 %.
	SlowBusy int `json:"slow_busy"`
}

// Point is one bucket of a run's latency series (ms) and the machine's
// CPU use in it (0-100 %).
type Point struct {
	T      float64 `json:"t"`
	N      int     `json:"n"`
	Errors int     `json:"errors,omitempty"`
	P50    float64 `json:"p50"`
	P99    float64 `json:"p99"`
	Max    float64 `json:"max"`
	CPU    float64 `json:"cpu"`
}

// Event is a scale event: the time and the replicas asked for.
type Event struct {
	T        float64 `json:"t"`
	Replicas int     `json:"replicas"`
}

// CPUSplit is CPU time (seconds) during one run, by who used it.
type CPUSplit struct {
	// Machine is every CPU's busy time (/proc/stat).
	Machine float64 `json:"machine"`
	// Node is the node's cgroup: kubelet, containerd, every pod.
	Node float64 `json:"node"`
	// Steelyard is the DaemonSet pod: the agent and nginx (part of Node).
	Steelyard float64 `json:"steelyard"`
	// LoadGen is the load generator (this benchmark's process).
	LoadGen float64 `json:"loadgen"`
	// ControlPlane is etcd, kube-apiserver, kube-controller-manager and
	// kube-scheduler.
	ControlPlane float64 `json:"control_plane"`
	// Other is the rest: work on the machine that is not this benchmark's.
	Other float64 `json:"other"`
}
