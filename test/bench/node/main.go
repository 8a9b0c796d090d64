// Command node-bench is `make bench-node`: the seed's dynamic test on a real
// node. steelyard runs from manifests/ with its documented --ingress opt-in
// (manifests/ingress/); an open-loop, constant-rate HTTP load goes through
// nginx to a Deployment of agnhost netexec pods (preStop pause, as users
// run them). Four runs of -duration each: steady (5 replicas) and churn
// (kubectl-style scale 5 <-> 7 every 10-12 s), once with VIP upstreams
// (steelyard's design) and once with --ingress-upstreams=pods (a reload per
// endpoint change). -phases adds two controls: bystander (a Deployment
// behind no Service scales instead) and frozen (the churn with the agent
// stopped once its rules hold the backends: frozen.go). It writes one JSON
// report (-o, read by node-plot), prints a table and asserts nothing.
//
// The rate: unless -rate is given, short steady runs at each -probe rate
// pick the highest one the machine sustains (no error, p99 under
// -probe-p99, the sender never more than 50 ms behind); the report says
// which.
//
// Where things run: the cluster of test/node/cluster (nothing in the root
// network namespace changes); the load generator's sockets live in a
// client namespace outside the node (sandbox.AddClient), which reaches
// nginx on the node's address, port 80 (hostNetwork). The load is bounded:
// rate x duration requests per run, each with a timeout. Needs root.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/steelyard-net/steelyard/test/bench/node/result"
	"github.com/steelyard-net/steelyard/test/node/cluster"
	"github.com/steelyard-net/steelyard/test/runinfo"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

func main() {
	var (
		manifests = flag.String("manifests", "manifests", "the repository's manifests/")
		rate      = flag.Int("rate", 0, "requests per second; 0: probe (-probe)")
		probe     = flag.String("probe", "500,1000,2000,3000,4000", "rates the probe tries, ascending")
		probeP99  = flag.Duration("probe-p99", 100*time.Millisecond, "a probe step with a higher p99 saturates")
		duration  = flag.Duration("duration", 2*time.Minute, "length of each run")
		timeout   = flag.Duration("timeout", 2*time.Second, "a request unanswered after this is an error")
		modes     = flag.String("modes", "vip,pods", "upstream modes to run")
		phases    = flag.String("phases", "steady,churn", "runs per mode: steady, churn (the backends scale 5 <-> 7), bystander (a Deployment not behind the Service scales so: the control), frozen (churn with the agent stopped after its sync: the node's share)")
		out       = flag.String("o", "docs/bench-node.json", "JSON report")
	)
	flag.Parse()
	if *rate < 0 || *rate > 10000 || *duration < 10*time.Second || *duration > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "node-bench: want 0 <= -rate <= 10000 and 10s <= -duration <= 10m")
		os.Exit(2)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		log.Printf("%v: tearing the node down", s)
		thawOnExit()
		cluster.StopAll()
		sandbox.CloseAll()
		os.Exit(130)
	}()
	phaseList, err := parsePhases(*phases)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-bench:", err)
		os.Exit(2)
	}
	rep, err := run(*manifests, *rate, *probe, *probeP99, *duration, *timeout, strings.Split(*modes, ","), phaseList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-bench:", err)
		os.Exit(1)
	}
	b, _ := json.MarshalIndent(rep, "", " ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "node-bench:", err)
		os.Exit(1)
	}
	result.Table(os.Stdout, rep)
	log.Printf("report: %s", *out)
}

// bench is the world of one benchmark.
type bench struct {
	c       *cluster.Cluster
	http    *http.Client // load, to nginx
	metrics *http.Client // the agent's /metrics
	timeout time.Duration
}

func run(manifests string, rate int, probe string, probeP99, duration, timeout time.Duration, modes, phases []string) (*result.Report, error) {
	ctx := context.Background()
	rep := &result.Report{Date: runinfo.Date(), Commit: runinfo.Commit(), CPUs: runtime.NumCPU(), Seconds: duration.Seconds(), Bucket: bucket.Seconds(), PreStopSeconds: cluster.NetexecPreStopSeconds}
	c, err := cluster.Start(ctx, cluster.Options{Logf: log.Printf})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := c.Stop(); err != nil {
			log.Printf("teardown: %v", err)
		}
	}()
	// The documented opt-in (manifests/ingress/, its patch/ingress-on.json).
	if err := c.Install(ctx, []string{manifests, manifests + "/ingress"}, nil, "--ingress-upstreams="+modes[0]); err != nil {
		return nil, fmt.Errorf("install: %w\n%s", err, c.Logs(30))
	}
	if slices.Contains(phases, "frozen") {
		if err := dropLivenessProbe(ctx, c); err != nil {
			return nil, err
		}
		rep.NoLivenessProbe = true
	}
	client, err := c.Sandbox.AddClient(netip.Addr{})
	if err != nil {
		return nil, err
	}
	b := &bench{c: c, timeout: timeout, http: httpClient(client, c.NodeIP.String()+":80", 256, timeout), metrics: httpClient(client, c.NodeIP.String()+":10279", 2, 2*time.Second)}
	if err := b.workload(ctx, slices.Contains(phases, "bystander")); err != nil {
		return nil, err
	}
	for i, mode := range modes {
		if i > 0 || mode != modes[0] {
			if err := b.setUpstreams(ctx, mode); err != nil {
				return nil, err
			}
		}
		if err := b.warm(); err != nil {
			return nil, fmt.Errorf("%s: %w", mode, err)
		}
		if rate == 0 {
			rate, rep.Probe = b.probe(probe, probeP99)
			log.Printf("probe: %d requests/s", rate)
		}
		rep.Rate = rate
		for _, phase := range phases {
			r, err := b.run(ctx, mode, phase, rate, duration)
			if err != nil {
				return nil, err
			}
			log.Printf("%s %s: %d requests, %d errors %v, %d reloads, p50 %.2f p99 %.2f p99.9 %.2f max %.2f ms; slow %d (near scale %d, slice %d, sync %d, reload %d, busy CPU %d); %d syncs; load %s",
				mode, phase, r.Requests, r.Errors, r.ErrClasses, r.Reloads, r.P50, r.P99, r.P999, r.Max, r.Slow, r.SlowNearScale, r.SlowNearSlice, r.SlowNearSync, r.SlowNearReload, r.SlowBusy, r.Syncs, r.LoadAvg)
			rep.Runs = append(rep.Runs, r)
		}
	}
	return rep, nil
}

// httpClient sends every request to target with sockets made in the
// client namespace.
func httpClient(ns *sandbox.NS, target string, conns int, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp4", target)
				return err
			})
			return c, err
		},
		MaxIdleConnsPerHost: conns,
		// Capped: when latency rises, an uncapped open-loop client opens a
		// connection per waiting request (4,000 at 2,000/s and 2 s), and
		// the storm saturates the machine it measures (seen: load 57,
		// 79% errors). Waiting for a connection counts in the latency.
		MaxConnsPerHost: conns,
		IdleConnTimeout: time.Minute,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// workload is the Deployment, its Service and the Ingress, and with
// bystander a second Deployment of the same pods that no Service selects.
func (b *bench) workload(ctx context.Context, bystander bool) error {
	doc := `apiVersion: apps/v1
kind: Deployment
metadata: {name: bench, namespace: default}
spec:
  replicas: 5
  selector: {matchLabels: {app: bench}}
  template:
    metadata: {labels: {app: bench}}
    spec:` + cluster.NetexecPodSpec + `---
apiVersion: v1
kind: Service
metadata: {name: bench, namespace: default}
spec:
  selector: {app: bench}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: bench, namespace: default}
spec:
  ingressClassName: steelyard
  rules:
  - host: bench.example
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: bench, port: {number: 80}}}}
`
	if bystander {
		doc += `---
apiVersion: apps/v1
kind: Deployment
metadata: {name: bystander, namespace: default}
spec:
  replicas: 5
  selector: {matchLabels: {app: bystander}}
  template:
    metadata: {labels: {app: bystander}}
    spec:` + cluster.NetexecPodSpec
	}
	f, err := os.CreateTemp("", "node-bench-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(doc); err != nil {
		return err
	}
	f.Close()
	if _, err := b.c.Kubectl(ctx, "apply", "-f", f.Name()); err != nil {
		return err
	}
	if bystander {
		if err := b.settle(ctx, "bystander", 5); err != nil {
			return err
		}
	}
	return b.settle(ctx, "bench", 5)
}

// settle waits until the Deployment app has n Ready pods and no others.
func (b *bench) settle(ctx context.Context, app string, n int) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		pods, err := b.c.Client().CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
		if err == nil {
			ready := 0
			for _, p := range pods.Items {
				for _, c := range p.Status.Conditions {
					if p.DeletionTimestamp == nil && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			if ready == n && len(pods.Items) == n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment %s: not %d Ready pods after 3 minutes", app, n)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// setUpstreams rolls the DaemonSet with --ingress-upstreams=mode.
func (b *bench) setUpstreams(ctx context.Context, mode string) error {
	ds, err := b.c.Client().AppsV1().DaemonSets("steelyard").Get(ctx, "steelyard", metav1.GetOptions{})
	if err != nil {
		return err
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	for i, a := range args {
		if strings.HasPrefix(a, "--ingress-upstreams=") {
			args[i] = "--ingress-upstreams=" + mode
		}
	}
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}})
	log.Printf("rolling the DaemonSet with --ingress-upstreams=%s", mode)
	if _, err := b.c.Kubectl(ctx, "-n", "steelyard", "patch", "ds", "steelyard", "--type=json", "-p", string(patch)); err != nil {
		return err
	}
	_, err = b.c.Kubectl(ctx, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=3m")
	return err
}

// warm waits until nginx serves bench.example without an error for a
// second, then lets the connection pools settle.
func (b *bench) warm() error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		if r := b.load(200, time.Second); r.errors() == 0 {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("nginx does not serve bench.example: %v", r.classes())
		}
		time.Sleep(time.Second)
	}
	b.load(1000, 3*time.Second)
	time.Sleep(2 * time.Second)
	return nil
}

// probe tries each rate for 10 s and returns the highest that passed
// (the lowest if none did).
func (b *bench) probe(list string, p99 time.Duration) (int, []result.Step) {
	var steps []result.Step
	best := 0
	for _, f := range strings.Split(list, ",") {
		rate, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || rate < 1 {
			continue
		}
		r := b.load(rate, 10*time.Second)
		s := r.summary()
		st := result.Step{Rate: rate, Requests: len(r.lat), Errors: r.errors(), P50: s.P50, P99: s.P99, P999: s.P999, Behind: ms(r.behind), LoadAvg: loadAvg()}
		st.OK = st.Errors == 0 && r.behind < 50*time.Millisecond && s.P99 < ms(p99)
		log.Printf("probe %d requests/s: %d errors, p50 %.2f p99 %.2f p99.9 %.2f ms, sender %.1f ms behind, load %s: ok %v", rate, st.Errors, s.P50, s.P99, s.P999, st.Behind, st.LoadAvg, st.OK)
		steps = append(steps, st)
		if best == 0 {
			best = rate
		}
		if !st.OK {
			break
		}
		best = rate
		time.Sleep(3 * time.Second)
	}
	return best, steps
}

// bucket is the width of a series point.
const bucket = 500 * time.Millisecond

// slow is the latency from which a request counts as slow in the
// attribution counts.
const slow = 50 * time.Millisecond

// run is one measured run: the load, the churn (phase "churn"), and the
// watchers of EndpointSlices, reloads and CPU.
func (b *bench) run(ctx context.Context, mode, phase string, rate int, duration time.Duration) (result.Run, error) {
	r := result.Run{Upstreams: mode, Phase: phase, SlowMS: ms(slow)}
	if err := b.settle(ctx, "bench", 5); err != nil {
		return r, err
	}
	// What scales: the backends, or for the control the bystanders (the
	// same pods, created and torn down on the same node, behind no VIP).
	scaled := "bench"
	if phase == "bystander" {
		scaled = "bystander"
		if err := b.settle(ctx, scaled, 5); err != nil {
			return r, err
		}
	}
	// The frozen phase reads the agent's metrics just before it stops it,
	// and counts no sync or reload after: none can happen.
	var fr *freezer
	var m0 agentMetrics
	var err error
	if phase == "frozen" {
		fr, err = b.freeze(ctx)
		defer func() {
			if fr != nil {
				if err := fr.thaw(ctx); err != nil {
					log.Print(err)
				}
			}
		}()
		if err != nil {
			return r, err
		}
		m0 = fr.m0
	} else if m0, err = b.metricsNow(); err != nil {
		return r, err
	}
	cpu0 := b.cpuNow(ctx)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	since := func(t time.Time) float64 { return t.Sub(start).Seconds() }
	var mu sync.Mutex
	var wg sync.WaitGroup
	// EndpointSlice changes (what the agent reacts to).
	slices, err := b.c.Client().DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=bench"})
	if err != nil {
		return r, err
	}
	w, err := b.c.Client().DiscoveryV1().EndpointSlices("default").Watch(wctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=bench", ResourceVersion: slices.ResourceVersion})
	if err != nil {
		return r, err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted {
				continue
			}
			mu.Lock()
			r.SliceChanges = append(r.SliceChanges, since(time.Now()))
			mu.Unlock()
		}
	}()
	// nginx reloads and kernel syncs: the agent's last-reload and
	// last-sync timestamps, polled (not while it is stopped).
	wg.Add(1)
	go func() {
		defer wg.Done()
		if fr != nil {
			return
		}
		lastReload, lastSync := m0.lastReload, m0.lastSync
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			m, err := b.metricsNow()
			if err != nil {
				continue
			}
			mu.Lock()
			if m.lastReload > lastReload {
				lastReload = m.lastReload
				r.ReloadTimes = append(r.ReloadTimes, since(time.Unix(0, int64(m.lastReload*1e9))))
			}
			if m.lastSync > lastSync {
				lastSync = m.lastSync
				r.SyncTimes = append(r.SyncTimes, since(time.Unix(0, int64(m.lastSync*1e9))))
			}
			mu.Unlock()
		}
	}()
	// The machine's CPU use per bucket (by the time it was read: a loaded
	// machine delays ticks).
	cpu := make([]float64, int(duration/bucket))
	wg.Add(1)
	go func() {
		defer wg.Done()
		prevBusy, prevAll := cpuTimes()
		t := time.NewTicker(bucket)
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			busy, all := cpuTimes()
			if all <= prevAll {
				continue
			}
			k := int(time.Since(start)/bucket) - 1
			mu.Lock()
			for i := max(0, k); i >= 0 && i < len(cpu) && cpu[i] == 0; i-- {
				cpu[i] = 100 * float64(busy-prevBusy) / float64(all-prevAll)
			}
			mu.Unlock()
			prevBusy, prevAll = busy, all
		}
	}()
	// Churn: 5 <-> 7 every 10, 11, 12 s.
	churnErr := make(chan error, 1)
	if churns(phase) {
		go func() {
			replicas := 5
			for i := 0; ; i++ {
				select {
				case <-wctx.Done():
					churnErr <- nil
					return
				case <-time.After(time.Duration(10+i%3) * time.Second):
				}
				if time.Since(start) > duration-2*time.Second {
					churnErr <- nil
					return
				}
				replicas = 12 - replicas
				at := time.Now()
				if _, err := b.c.Client().AppsV1().Deployments("default").UpdateScale(ctx, scaled,
					&autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: scaled, Namespace: "default"}, Spec: autoscalingv1.ScaleSpec{Replicas: int32(replicas)}}, metav1.UpdateOptions{}); err != nil {
					churnErr <- err
					return
				}
				mu.Lock()
				r.Scales = append(r.Scales, result.Event{T: since(at), Replicas: replicas})
				mu.Unlock()
			}
		}()
	} else {
		churnErr <- nil
	}
	log.Printf("%s %s: %d requests/s for %v", mode, phase, rate, duration)
	l := b.loadFrom(start, rate, duration)
	// Late reloads and slice changes still count.
	time.Sleep(time.Second)
	stop()
	wg.Wait()
	if err := <-churnErr; err != nil {
		return r, err
	}
	m1 := m0
	if fr != nil {
		// Still the same stopped agent, or the run measured something
		// else; CPU is read before the thaw, nginx's log after it (the
		// agent copies nginx's error log to its own).
		if err := fr.check(ctx); err != nil {
			return r, err
		}
		if r.FrozenKept, err = fr.alive(ctx); err != nil {
			return r, err
		}
		r.CPUSeconds = cpuDelta(cpu0, b.cpuNow(ctx))
		err = fr.thaw(ctx)
		fr = nil
		if err != nil {
			return r, err
		}
		time.Sleep(2 * time.Second)
	} else {
		if m1, err = b.metricsNow(); err != nil {
			return r, err
		}
		r.CPUSeconds = cpuDelta(cpu0, b.cpuNow(ctx))
	}
	r.NginxErrors = b.nginxErrors(ctx, start)
	s := l.summary()
	r.Requests, r.Errors, r.ErrClasses = len(l.lat), l.errors(), l.classes()
	r.P50, r.P99, r.P999, r.Max = s.P50, s.P99, s.P999, s.Max
	r.Reloads = int(m1.reloads - m0.reloads)
	r.Syncs = int(m1.syncs - m0.syncs)
	if r.Syncs > 0 {
		r.SyncMeanMS = 1000 * (m1.syncSeconds - m0.syncSeconds) / float64(r.Syncs)
	}
	r.LoadAvg = loadAvg()
	r.Series = l.series(start, duration, cpu)
	for _, v := range cpu {
		r.CPUBusy += v / float64(len(cpu))
	}
	scales := make([]float64, len(r.Scales))
	for i, e := range r.Scales {
		scales[i] = e.T
	}
	for i, lat := range l.lat {
		if lat < slow {
			continue
		}
		r.Slow++
		t := since(l.due[i])
		r.SlowNearScale += near(t, scales)
		r.SlowNearSlice += near(t, r.SliceChanges)
		r.SlowNearReload += near(t, r.ReloadTimes)
		r.SlowNearSync += near(t, r.SyncTimes)
		if k := int(t / bucket.Seconds()); k < len(cpu) && cpu[k] >= 90 {
			r.SlowBusy++
		}
	}
	if phase == "churn" || phase == "frozen" {
		_, err := b.c.Client().AppsV1().Deployments("default").UpdateScale(ctx, "bench",
			&autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: "default"}, Spec: autoscalingv1.ScaleSpec{Replicas: 5}}, metav1.UpdateOptions{})
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// nginxUpstreamErrors are the error-log phrases that tell why nginx failed
// or retried a request towards its upstream.
var nginxUpstreamErrors = []string{
	"upstream prematurely closed connection",
	"Connection reset by peer",
	"Connection refused",
	"No route to host",
	"upstream timed out",
	"no live upstreams",
}

// nginxErrors counts the upstream errors nginx logged since start (its
// error log goes to the steelyard container's stderr).
func (b *bench) nginxErrors(ctx context.Context, start time.Time) map[string]int {
	out, err := b.c.Kubectl(ctx, "-n", "steelyard", "logs", "ds/steelyard", "-c", "steelyard", "--since-time="+start.UTC().Format(time.RFC3339))
	if err != nil {
		return map[string]int{"(logs unavailable)": 1}
	}
	m := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		for _, e := range nginxUpstreamErrors {
			if strings.Contains(line, e) {
				m[e]++
			}
		}
	}
	return m
}

// near is 1 if t is within one second after one of the times.
func near(t float64, times []float64) int {
	for _, e := range times {
		if d := t - e; d >= 0 && d < 1 {
			return 1
		}
	}
	return 0
}

// agentMetrics is what a run reads of the agent's /metrics.
type agentMetrics struct {
	reloads, lastReload float64 // nginx reloads, and the last one's Unix time
	syncs, syncSeconds  float64 // kernel syncs (iptables-restore), their total time
	lastSync            float64 // the last sync's Unix time
}

// metricsNow reads the agent's metrics.
func (b *bench) metricsNow() (agentMetrics, error) {
	var m agentMetrics
	resp, err := b.metrics.Get("http://node/metrics")
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "steelyard_ingress_nginx_reloads_total":
			m.reloads = v
		case "steelyard_ingress_nginx_last_reload_timestamp_seconds":
			m.lastReload = v
		case "steelyard_sync_proxy_rules_duration_seconds_count":
			m.syncs = v
		case "steelyard_sync_proxy_rules_duration_seconds_sum":
			m.syncSeconds = v
		case "steelyard_sync_proxy_rules_last_timestamp_seconds":
			m.lastSync = v
		}
	}
	return m, nil
}

// cpuTimes returns the machine's busy and total CPU time (ticks).
func cpuTimes() (busy, all uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, s := range f[1:] {
		v, _ := strconv.ParseUint(s, 10, 64)
		all += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, all
}

// loadAvg is /proc/loadavg's three load averages.
func loadAvg() string {
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

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
