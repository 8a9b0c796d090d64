// Package point is the one measured point of the scale benchmark, as
// test/bench/scale prints it (one JSON line) and test/bench/scale/plot
// reads it.
package point

// Result is one measured point; times in seconds.
type Result struct {
	Dataplane string  `json:"dataplane"`
	Services  int     `json:"services"`
	Endpoints int     `json:"endpoints"`
	First     float64 `json:"first_sync_s"`
	Partial   float64 `json:"partial_sync_s"`
	// Endpoint: one endpoint of one Service replaced by a new address
	// (a new endpoint chain, the old one flushed), median of 5.
	Endpoint float64 `json:"endpoint_sync_s,omitempty"`
	// Idle: a periodic sync with nothing changed, median of 5.
	Idle    float64 `json:"idle_sync_s,omitempty"`
	Full    float64 `json:"full_resync_s"`
	Explain float64 `json:"explain_s"`
	List    float64 `json:"list_s"`
	RSSMiB  float64 `json:"rss_mib"`
	// CPU seconds (user + system, this process and its nft children) of
	// the same steps: what a step costs when other jobs share the cores.
	FirstCPU    float64 `json:"first_sync_cpu_s"`
	PartialCPU  float64 `json:"partial_sync_cpu_s"`
	EndpointCPU float64 `json:"endpoint_sync_cpu_s,omitempty"`
	IdleCPU     float64 `json:"idle_sync_cpu_s,omitempty"`
	FullCPU     float64 `json:"full_resync_cpu_s"`
	ExplainCPU  float64 `json:"explain_cpu_s"`
	ListCPU     float64 `json:"list_cpu_s"`
	// The kernel's share of a commit (nftables, -probe): one transaction
	// that adds a service-ips element with a goto verdict and one that
	// adds a nodeport-ips address (no verdict), median CPU seconds of 5
	// each. A verdict makes the kernel validate the whole chain graph
	// from every base chain at commit (nft_table_validate); the
	// difference is that walk.
	VerdictCommitCPU float64 `json:"verdict_commit_cpu_s,omitempty"`
	PlainCommitCPU   float64 `json:"plain_commit_cpu_s,omitempty"`
	// Points of test/bench/k8s (a proxy against a real API server, its
	// Dataplane ending in "(API server)") have only First, RSSMiB,
	// FirstCPU and these: an endpoint change written to the API server
	// until the kernel holds it, p50 and p99 of the run's changes.
	ChangeP50 float64 `json:"change_kernel_p50_s,omitempty"`
	ChangeP99 float64 `json:"change_kernel_p99_s,omitempty"`
	// The traffic phase of test/bench/k8s (-traffic-sizes): a client on
	// the node, one Service with two real backends. Connect + first byte
	// of new connections through the VIP and direct to a pod address
	// (p50, p99), and requests/s with a new connection per request and
	// with keepalive, through the VIP and direct. Ratios are meaningful
	// within one point only (one run, the same load).
	FirstPacketP50       float64 `json:"first_packet_p50_s,omitempty"`
	FirstPacketP99       float64 `json:"first_packet_p99_s,omitempty"`
	DirectFirstPacketP50 float64 `json:"direct_first_packet_p50_s,omitempty"`
	DirectFirstPacketP99 float64 `json:"direct_first_packet_p99_s,omitempty"`
	RPSNewVIP            float64 `json:"rps_new_vip,omitempty"`
	RPSNewDirect         float64 `json:"rps_new_direct,omitempty"`
	RPSKeepaliveVIP      float64 `json:"rps_keepalive_vip,omitempty"`
	RPSKeepaliveDirect   float64 `json:"rps_keepalive_direct,omitempty"`
	// LoadAvg is the load average at the end of the run: the 1-minute
	// figure in older points, the 1, 5 and 15 minute ones since points
	// carry Commit and Date.
	LoadAvg string `json:"loadavg"`
	// Commit is the commit the benchmark was built from (runinfo.Commit,
	// "-dirty" when the tree had changes); Date is when the point was
	// measured (RFC 3339, UTC). Points from before 2026-12-04 have
	// neither: test/docsgen prints "commit unknown" for them.
	// CountConnections: the point ran with per-endpoint connection
	// counting on (issue 23); Counts is then one read of every counter
	// (what a metrics scrape costs) and its CPU, RulesetBytes the size
	// of the listing (nft list ruleset, iptables-save) in either case.
	CountConnections bool    `json:"count_connections,omitempty"`
	Counts           float64 `json:"counts_s,omitempty"`
	CountsCPU        float64 `json:"counts_cpu_s,omitempty"`
	RulesetBytes     int     `json:"ruleset_bytes,omitempty"`
	Commit           string  `json:"commit,omitempty"`
	Date             string  `json:"date,omitempty"`

	// Points of test/bench/k8s since 2026-12-07 also carry these. RunID
	// names the run (one `make bench-k8s`): test/docsgen compares points
	// of one run only. Proxy is k8s-bench's -proxies name
	// ("kube-proxy-nftables-msp250ms"), MinSyncPeriod the proxy's
	// --min-sync-period (given, or its default). Changes is how many
	// endpoint changes were measured; ChangeCPU the proxy's CPU seconds
	// during them divided by that count; TotalCPU its CPU seconds from
	// start to the end of the run (first sync, changes, quiet period).
	// Explain and ExplainCPU are then ExplainCmd's wall and CPU seconds
	// (steelyard explain; kube-proxy has none: its ruleset listed).
	// MapsMemlock is the ebpf mode's maps' kernel memory (memlock, bytes);
	// LoadSeconds how long loading the API server took for the size.
	RunID         string  `json:"run_id,omitempty"`
	Proxy         string  `json:"proxy,omitempty"`
	MinSyncPeriod string  `json:"min_sync_period,omitempty"`
	Changes       int     `json:"changes,omitempty"`
	ChangeCPU     float64 `json:"change_cpu_s,omitempty"`
	TotalCPU      float64 `json:"total_cpu_s,omitempty"`
	ExplainCmd    string  `json:"explain_cmd,omitempty"`
	MapsMemlock   uint64  `json:"maps_memlock_bytes,omitempty"`
	LoadSeconds   float64 `json:"load_s,omitempty"`
}
