//go:build k8s

package k8s

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/test/sandbox"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// TestEndpointChurn: the endpoints of one Service go 5 -> 7 -> 5 every 2 s
// for 60 s (EndpointSlice updates through the API) while a client keeps
// opening connections. Every pod keeps running, so every endpoint in the
// slice is ready and no connection may fail; at the end the kernel equals
// the final objects.
func TestEndpointChurn(t *testing.T) {
	const (
		vip      = "198.18.0.20"
		period   = 2 * time.Second
		duration = 60 * time.Second
	)
	e := newEnv(t)
	var pods []backend
	for i := 1; i <= 7; i++ {
		pods = append(pods, backend{fmt.Sprintf("c%d", i), fmt.Sprintf("198.19.2.%d", i+1)})
	}
	e.addPods(pods...)
	e.startAgent(e.cp.Kubeconfig)
	e.create(newService("churn", vip, nil, nil), nil)
	sl, err := e.admin.DiscoveryV1().EndpointSlices(testNS).Create(t.Context(), newSlice("churn", nil, pods[:5]...), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	backends := func() int {
		if v := viewcheck.Find(e.explain(), vip, servicePort); v != nil {
			return len(v.Backends)
		}
		return 0
	}
	sandbox.Poll(t, 10*time.Second, 20*time.Millisecond, "5 backends", func() (bool, string) {
		return backends() == 5, fmt.Sprintf("%d backends", backends())
	})

	// Load: runs of 250 connections, 4 at a time, paced to at most 2,000
	// connections a second (each leaves a conntrack entry for 10 s, and the
	// conntrack limit is the host's), until told to stop (bounded by the
	// deadline in any case).
	const runSize, maxRate = 250, 2000
	var (
		mu       sync.Mutex
		total    = sandbox.Result{Dst: vipPort(vip), Proto: "tcp", Counts: map[string]int{}, Errors: map[string]int{}}
		runs     int
		loadErr  error
		stopLoad = make(chan struct{})
		loadDone = make(chan struct{})
	)
	loadDeadline := time.Now().Add(duration + 30*time.Second)
	go func() {
		defer close(loadDone)
		for time.Now().Before(loadDeadline) {
			select {
			case <-stopLoad:
				return
			default:
			}
			runStart := time.Now()
			r, err := e.client.TCPConns(vipPort(vip), runSize, sandbox.Load{Concurrency: 4, MaxDuration: 20 * time.Second})
			mu.Lock()
			runs++
			total.Requested += r.Requested
			total.Attempted += r.Attempted
			for k, v := range r.Counts {
				total.Counts[k] += v
			}
			for k, v := range r.Errors {
				total.Errors[k] += v
			}
			if err != nil && loadErr == nil {
				loadErr = err
			}
			mu.Unlock()
			time.Sleep(time.Until(runStart.Add(runSize * time.Second / maxRate)))
		}
	}()

	// Churn: every period, the slice gets 7 or 5 endpoints and a new
	// last-change-trigger-time; explain is polled until the kernel shows
	// the new count, which measures API write -> kernel.
	var latencies []time.Duration
	start := time.Now()
	updates := 0
	for i := 0; time.Since(start) < duration; i++ {
		n := 7
		if i%2 == 1 {
			n = 5
		}
		setEndpoints(sl, pods[:n]...)
		if sl.Annotations == nil {
			sl.Annotations = map[string]string{}
		}
		written := time.Now()
		sl.Annotations[corev1.EndpointsLastChangeTriggerTime] = written.Format(time.RFC3339Nano)
		sl, err = e.admin.DiscoveryV1().EndpointSlices(testNS).Update(t.Context(), sl, metav1.UpdateOptions{})
		if err != nil {
			close(stopLoad)
			t.Fatalf("update %d: %v", i, err)
		}
		updates++
		next := start.Add(time.Duration(i+1) * period)
		seen := false
		for time.Now().Before(next) {
			if backends() == n {
				latencies = append(latencies, time.Since(written))
				seen = true
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !seen {
			t.Errorf("update %d (%d endpoints) not in the kernel within %v", i, n, period)
		}
		time.Sleep(time.Until(next))
	}
	close(stopLoad)
	<-loadDone
	churnTime := time.Since(start)

	mu.Lock()
	total.Elapsed = churnTime
	t.Logf("load during %v of churn (%d updates, %d runs): %v", churnTime.Round(time.Millisecond), updates, runs, total)
	if loadErr != nil {
		t.Errorf("load: %v", loadErr)
	}
	if total.Failed() > 0 || total.Attempted != total.Requested {
		t.Errorf("%d of %d connections failed (%v), %d not attempted", total.Failed(), total.Requested, total.Errors, total.Requested-total.Attempted)
	}
	for _, p := range pods {
		if total.Counts[p.pod] == 0 {
			t.Errorf("pod %s never answered", p.pod)
		}
	}
	if total.OK() < 10000 {
		t.Errorf("only %d connections in %v: the load was too thin to show anything", total.OK(), churnTime)
	}
	mu.Unlock()

	if len(latencies) > 0 {
		sorted := append([]time.Duration(nil), latencies...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		t.Logf("API write -> kernel (explain polled every ~10 ms): %d changes, median %v, max %v",
			len(sorted), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	}
	count, sum, maxBound := histogram(e.metrics(), "steelyard_network_programming_duration_seconds")
	t.Logf("steelyard_network_programming_duration_seconds: %v observations, mean %.1f ms, max <= %v s (bucket bound)",
		count, 1000*sum/max(count, 1), maxBound)
	if int(count) < updates {
		t.Errorf("network programming latency observed %v times, want >= %d (one per slice update)", count, updates)
	}
	if maxBound > 2 {
		t.Errorf("network programming latency up to %v s (bucket bound), want <= 2 s", maxBound)
	}

	took := e.waitVerify(10 * time.Second)
	t.Logf("verify --kubeconfig passes %v after the last update", took.Round(time.Millisecond))
	if n := backends(); n != 5 {
		t.Errorf("final kernel state: %d backends, want 5", n)
	}
}
