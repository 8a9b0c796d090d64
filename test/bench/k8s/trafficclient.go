package main

// The traffic phase's client: a child process of k8s-bench
// (`k8s-bench traffic-client`), started in the proxy's network namespace by
// `ip netns exec` and, for a proxy whose socket programs balance only the
// processes of one cgroup (--mode ebpf), moved into that cgroup by the
// parent before it reads its job. It reads one trafficJob (JSON) on stdin,
// measures, and writes one trafficOutput (JSON) on stdout.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// trafficClientCmd is the first argument that makes k8s-bench the client.
const trafficClientCmd = "traffic-client"

// trafficJob is what the client measures; durations in nanoseconds.
type trafficJob struct {
	VIP    string `json:"vip"`    // the Service's ClusterIP:port
	Direct string `json:"direct"` // one backend's pod address:port
	// Conns new connections on each path for the first-byte latency,
	// alternating VIP and direct, within Limit.
	Conns int           `json:"conns"`
	Limit time.Duration `json:"limit"`
	// Duration per path and mode (new connection per request,
	// keepalive), the paths interleaved request by request in Workers
	// concurrent loops.
	Duration time.Duration `json:"duration"`
	Workers  int           `json:"workers"`
	// Ready bounds the wait for the VIP's first answer (the proxy
	// programs the new Service); Timeout bounds one connection.
	Ready   time.Duration `json:"ready"`
	Timeout time.Duration `json:"timeout"`
}

// trafficOutput is what the client measured.
type trafficOutput struct {
	// Error says why nothing (more) was measured.
	Error string `json:"error,omitempty"`
	// Cgroup is the client's cgroup v2 path (/proc/self/cgroup "0::").
	Cgroup string `json:"cgroup"`
	// ReadyS: from the start of the wait to the VIP's first answer.
	ReadyS float64 `json:"ready_s"`
	// First-byte latency of each new connection, seconds, and failures.
	FirstVIP       []float64 `json:"first_vip_s"`
	FirstDirect    []float64 `json:"first_direct_s"`
	FirstVIPErrors int       `json:"first_vip_errors"`
	FirstDirErrors int       `json:"first_direct_errors"`
	FirstError     string    `json:"first_error,omitempty"`
	// Requests per path and mode.
	NewVIP     rate `json:"new_vip"`
	NewDirect  rate `json:"new_direct"`
	KeepVIP    rate `json:"keepalive_vip"`
	KeepDirect rate `json:"keepalive_direct"`
	// IDs counts the backends that answered new connections through the
	// VIP (first-byte samples and new-connection requests).
	IDs map[string]int `json:"backend_ids"`
}

// trafficClient is the child's main: job on stdin, output on stdout.
func trafficClient(stdin io.Reader, stdout io.Writer) int {
	var job trafficJob
	if err := json.NewDecoder(stdin).Decode(&job); err != nil {
		fmt.Fprintln(os.Stderr, "traffic-client: reading the job:", err)
		return 2
	}
	out := measureTraffic(context.Background(), job)
	out.Cgroup, _ = sandbox.OwnCgroup() // "" when unknown
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "traffic-client:", err)
		return 2
	}
	return 0
}

// measureTraffic waits for the VIP to answer, then measures the
// first-byte latency and the request rates.
func measureTraffic(ctx context.Context, job trafficJob) trafficOutput {
	out := trafficOutput{IDs: map[string]int{}}
	rctx, cancel := context.WithTimeout(ctx, job.Ready)
	ready, err := waitAnswer(rctx, job.VIP, job.Timeout)
	cancel()
	out.ReadyS = ready.Seconds()
	if err != nil {
		out.Error = "the VIP path does not reach the backends: " + err.Error()
		return out
	}
	// The direct path must answer as well, or its figures mean nothing.
	if _, _, err := exchange(job.Direct, job.Timeout); err != nil {
		out.Error = "the direct path does not reach the backend: " + err.Error()
		return out
	}

	// First byte: VIP and direct alternate, each going first in turn, so
	// both see the same load on the machine.
	end := time.Now().Add(job.Limit)
	for i := 0; i < job.Conns && time.Now().Before(end); i++ {
		for k := range 2 {
			vip := (i+k)%2 == 0
			addr := job.Direct
			if vip {
				addr = job.VIP
			}
			id, d, err := exchange(addr, job.Timeout)
			switch {
			case err != nil && vip:
				out.FirstVIPErrors++
			case err != nil:
				out.FirstDirErrors++
			case vip:
				out.FirstVIP = append(out.FirstVIP, d.Seconds())
				out.IDs[string(id)]++
			default:
				out.FirstDirect = append(out.FirstDirect, d.Seconds())
			}
			if err != nil && out.FirstError == "" {
				out.FirstError = err.Error()
			}
		}
	}

	// Request rates: VIP and direct interleaved request by request
	// (pairedRates), 2 x Duration per mode.
	out.NewVIP, out.NewDirect = pairedRates(func() requester {
		return newConns{vip: job.VIP, direct: job.Direct, timeout: job.Timeout}
	}, job.Workers, 2*job.Duration, out.IDs)
	out.KeepVIP, out.KeepDirect = pairedRates(func() requester {
		return &keepaliveConns{addr: [2]string{job.Direct, job.VIP}, timeout: job.Timeout}
	}, job.Workers, 2*job.Duration, nil)
	return out
}
