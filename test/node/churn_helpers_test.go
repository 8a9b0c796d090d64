//go:build node

package node

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// churn is one scale-churn run: a Deployment of NetexecPodSpec pods (the
// preStop pause users run) scaled between lo and hi replicas every period
// for duration, under a bounded load of new connections to its Service
// from the client pod.
type churn struct {
	name     string
	lo, hi   int
	period   func(i int) time.Duration
	duration time.Duration
}

// churnResult is what a churn run saw.
type churnResult struct {
	total, failed int
	// classes counts failures by kind ("refused", "timeout", ...).
	classes map[string]int
	// longestBurst is the longest run of consecutive failed connections
	// (in completion order over all workers).
	longestBurst int
	failures     []string // "12.3s: error", the first 50
	events       []string // scale events and EndpointSlice changes
	pods         int      // distinct pods that answered
	load         string   // /proc/loadavg at the start and the end
}

// failedMsg is the failure line of a run with failures: counts, the first
// failures and the events of the 10 s before the first one. It goes into
// the t.Errorf itself because CI summaries keep only a test's last lines.
func (r churnResult) failedMsg() string {
	msg := fmt.Sprintf("%d of %d connections failed: %v (load %s)", r.failed, r.total, r.classes, r.load)
	if len(r.failures) == 0 {
		return msg
	}
	msg += "; first: " + strings.Join(r.failures[:min(3, len(r.failures))], " | ")
	var first float64
	fmt.Sscanf(r.failures[0], "%fs:", &first)
	var near []string
	for _, e := range r.events {
		var at float64
		if _, err := fmt.Sscanf(e, "%fs:", &at); err == nil && at >= first-10 && at <= first+1 {
			near = append(near, e)
		}
	}
	return msg + "; events before it: " + strings.Join(near, " | ")
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func errClass(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "refused"):
		return "refused"
	case strings.Contains(s, "timeout"), strings.Contains(s, "deadline"):
		return "timeout"
	case strings.Contains(s, "reset"):
		return "reset"
	case strings.Contains(s, "EOF"):
		return "EOF"
	}
	return "other"
}

// run creates the Deployment and Service, scales as c says under load and
// returns what happened. The load is bounded: 4 connections at a time, at
// most 100 a second each, for c.duration.
func (c churn) run(t *testing.T) churnResult {
	t.Helper()
	web(t)
	apply(t, deploymentYAML(c.name, c.lo, "", "ClusterIP"))
	t.Cleanup(func() {
		_, _ = node.Kubectl(context.Background(), "delete", "deployment/"+c.name, "service/"+c.name, "--wait=false")
	})
	waitReady(t, "app="+c.name, c.lo, 2*time.Minute)
	waitVerify(t, 30*time.Second)
	vip := clusterIP(t, c.name)
	cl := client(t)
	res := churnResult{classes: map[string]int{}, load: loadavg()}
	start := time.Now()
	var mu sync.Mutex
	at := func() string { return fmt.Sprintf("%.2fs", time.Since(start).Seconds()) }
	event := func(s string) {
		mu.Lock()
		res.events = append(res.events, at()+": "+s)
		mu.Unlock()
	}
	// The EndpointSlice changes, to place the failures among them.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if w, err := node.Client().DiscoveryV1().EndpointSlices("default").Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + c.name}); err == nil {
		go func() {
			for ev := range w.ResultChan() {
				sl, ok := ev.Object.(*discoveryv1.EndpointSlice)
				if !ok {
					continue
				}
				var eps []string
				for _, ep := range sl.Endpoints {
					st := "R"
					switch {
					case ep.Conditions.Ready != nil && *ep.Conditions.Ready:
					case ep.Conditions.Serving != nil && *ep.Conditions.Serving:
						st = "ST" // serving, terminating
					case ep.Conditions.Terminating != nil && *ep.Conditions.Terminating:
						st = "T"
					default:
						st = "N"
					}
					eps = append(eps, ep.Addresses[0]+"="+st)
				}
				event(fmt.Sprintf("slice %s %s [%s]", ev.Type, sl.Name, strings.Join(eps, " ")))
			}
		}()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var total atomic.Int64
	r := &tally{}
	burst := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				name, err := hostname(cl, vip)
				r.add(name, err)
				total.Add(1)
				mu.Lock()
				if err != nil {
					res.classes[errClass(err)]++
					burst++
					res.longestBurst = max(res.longestBurst, burst)
					if len(res.failures) < 50 {
						res.failures = append(res.failures, fmt.Sprintf("%s: %v", at(), err))
					}
				} else {
					burst = 0
				}
				mu.Unlock()
			}
		}()
	}
	replicas := c.lo
	for i := 0; time.Since(start) < c.duration; i++ {
		time.Sleep(c.period(i))
		replicas = c.lo + c.hi - replicas
		kubectl(t, "scale", "deployment/"+c.name, fmt.Sprintf("--replicas=%d", replicas))
		event(fmt.Sprintf("scale to %d", replicas))
	}
	close(stop)
	wg.Wait()
	res.total, res.failed, res.pods = int(total.Load()), r.fails, len(r.names)
	res.load += " -> " + loadavg()
	names := make([]string, 0, len(r.names))
	for n := range r.names {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%s: scale %d <-> %d for %v: %d connections to %s, %d failed %v (longest burst %d), %d distinct pods answered; load average %s",
		c.name, c.lo, c.hi, time.Since(start).Round(time.Second), res.total, vip, res.failed, res.classes, res.longestBurst, res.pods, res.load)
	if res.failed != 0 {
		mu.Lock()
		t.Logf("run started %s; failures:\n  %s\nevents:\n  %s", start.UTC().Format(time.RFC3339Nano),
			strings.Join(res.failures, "\n  "), strings.Join(res.events, "\n  "))
		mu.Unlock()
		if kubeProxyMode == "" {
			// The agent's syncs over the run (each logs its "queued":
			// from the endpoint change to the sync's start).
			if out, err := node.Kubectl(context.Background(), "-n", "steelyard", "logs", "ds/steelyard", "-c", "steelyard",
				fmt.Sprintf("--since=%ds", int(time.Since(start).Seconds())+5)); err == nil {
				var syncs []string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, "synced") || strings.Contains(l, "level=warn") || strings.Contains(l, "level=error") {
						syncs = append(syncs, l)
					}
				}
				t.Logf("steelyard syncs during the run:\n%s", strings.Join(syncs, "\n"))
			}
		}
	}
	if r.ok() < 1000 {
		t.Errorf("only %d connections succeeded", r.ok())
	}
	waitReady(t, "app="+c.name, replicas, 2*time.Minute)
	waitVerify(t, 30*time.Second)
	return res
}
