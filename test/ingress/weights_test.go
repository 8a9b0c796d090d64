//go:build ingress

package ingress

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/ingress/harness"
	"github.com/steelyard-net/steelyard/test/viewcheck"
)

// tally counts answers (pod names, statuses, error classes) of requests.
type tally struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
}

func (t *tally) add(s string) {
	t.mu.Lock()
	if t.counts == nil {
		t.counts = map[string]int{}
	}
	t.counts[s]++
	t.total++
	t.mu.Unlock()
}

func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.counts))
	for k := range t.counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, t.counts[k])
	}
	return strings.TrimSpace(b.String())
}

// send sends n requests for host over fresh connections, conc at a time,
// or until stop is closed when n <= 0 (bounded by limit).
func send(w *harness.World, host string, n, conc int, stop <-chan struct{}, limit time.Duration) *tally {
	var (
		t    = &tally{}
		wg   sync.WaitGroup
		next = make(chan struct{})
	)
	deadline := time.After(limit)
	go func() {
		defer close(next)
		for i := 0; n <= 0 || i < n; i++ {
			select {
			case next <- struct{}{}:
			case <-stop:
				return
			case <-deadline:
				return
			}
		}
	}()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := w.HTTPClient(nil, false, 1, 5*time.Second)
			for range next {
				resp, err := c.Get("http://" + host + "/")
				if err != nil {
					t.add("error: " + harness.ErrClass(err))
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.add(fmt.Sprint(resp.StatusCode))
					continue
				}
				t.add(strings.TrimSpace(string(b)))
			}
		}()
	}
	wg.Wait()
	return t
}

// TestWeights: a 10/90 Service behind an Ingress; 5,000 requests over fresh
// client connections split within 2 points. Upstream keepalive is off for
// this test (ConfigMap upstream-keepalive-connections: 0): the kernel splits
// connections, so with keepalive a reused upstream connection stays on its
// pod and the split holds per connection, not per request.
func TestWeights(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	addPods(t, w, map[string]string{"w1": "198.19.4.2", "w2": "198.19.4.3"})
	must(t, w.Service(ctx, "weighted", "198.18.1.20", map[string]string{"steelyard.io/weights": "w1=10,w2=90"}))
	must(t, w.SetEndpoints(ctx, "weighted", "w1", "w2"))
	must(t, w.Settings(ctx, map[string]string{"upstream-keepalive-connections": "0"}))
	must(t, w.Apply(ctx, harness.IngressOf("weights", harness.Rule{Host: "weights.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "weighted"}}})))
	startAgent(t, w)
	eventually(t, 20*time.Second, "weights.example served", func() string {
		if got := answer(w.Get("weights.example", "/", nil)); got != "w1" && got != "w2" {
			return got
		}
		return ""
	})
	conf, err := w.Conf()
	must(t, err)
	if strings.Contains(conf, "keepalive 0") || strings.Contains(conf, "        keepalive ") {
		t.Fatalf("upstream keepalive still on:\n%s", conf)
	}
	const n = 5000
	start := time.Now()
	res := send(w, "weights.example", n, 8, nil, 3*time.Minute)
	t.Logf("%d requests in %v: %s", res.total, time.Since(start).Round(time.Millisecond), res)
	if res.total != n || res.counts["w1"]+res.counts["w2"] != n {
		t.Fatalf("not every request reached a pod: %s", res)
	}
	for pod, want := range map[string]float64{"w1": 10, "w2": 90} {
		got := 100 * float64(res.counts[pod]) / n
		sigma := 100 * math.Sqrt(want/100*(1-want/100)/n)
		t.Logf("  %s configured %5.2f%%  observed %5.2f%%  diff %+.2f points (sigma %.2f, tolerance 2)", pod, want, got, got-want, sigma)
		if math.Abs(got-want) > 2 {
			t.Errorf("%s: %.2f%%, want %.0f%% within 2 points", pod, got, want)
		}
	}
}

// backendsOf reads `steelyard explain -o json` in the node namespace and
// returns how many backends vip:80 has.
func backendsOf(t *testing.T, w *harness.World, vip string) int {
	t.Helper()
	out, err := w.SB.Node.Exec(steelyardBin, "explain", "-o", "json")
	must(t, err)
	var views []dataplane.ServiceView
	must(t, json.Unmarshal([]byte(out), &views))
	if v := viewcheck.Find(views, vip, harness.ServicePort); v != nil {
		return len(v.Backends)
	}
	return 0
}

// TestChurnNoReload: with VIP upstreams, the Service's endpoints go
// 5 -> 7 -> 5 three times while a client keeps sending requests over
// fresh connections; the kernel follows each change, nginx is never
// reloaded, and every request is served.
func TestChurnNoReload(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	pods := map[string]string{}
	var names []string
	for i := 1; i <= 7; i++ {
		name := fmt.Sprintf("c%d", i)
		pods[name] = fmt.Sprintf("198.19.5.%d", i+1)
		names = append(names, name)
	}
	addPods(t, w, pods)
	const vip = "198.18.1.50"
	must(t, w.Service(ctx, "churn", vip, nil))
	must(t, w.SetEndpoints(ctx, "churn", names[:5]...))
	must(t, w.Apply(ctx, harness.IngressOf("churn", harness.Rule{Host: "churn.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "churn"}}})))
	startAgent(t, w)
	eventually(t, 20*time.Second, "churn.example served", func() string {
		if got := answer(w.Get("churn.example", "/", nil)); !strings.HasPrefix(got, "c") {
			return got
		}
		return ""
	})
	time.Sleep(time.Second) // renders of the start-up burst
	reloads := metric(t, w, "steelyard_ingress_nginx_reloads_total")
	hash := metric(t, w, "steelyard_ingress_nginx_config_hash")

	stop := make(chan struct{})
	done := make(chan *tally)
	go func() { done <- send(w, "churn.example", 0, 4, stop, 3*time.Minute) }()
	for cycle := 1; cycle <= 3; cycle++ {
		for _, n := range []int{7, 5} {
			must(t, w.SetEndpoints(ctx, "churn", names[:n]...))
			eventually(t, 10*time.Second, fmt.Sprintf("cycle %d: %d backends in the kernel", cycle, n), func() string {
				if got := backendsOf(t, w, vip); got != n {
					return fmt.Sprintf("%d backends", got)
				}
				return ""
			})
			time.Sleep(2 * time.Second)
		}
	}
	close(stop)
	res := <-done
	t.Logf("%d requests during churn: %s", res.total, res)
	ok := 0
	for _, name := range names {
		ok += res.counts[name]
	}
	if res.total == 0 || ok != res.total {
		t.Errorf("%d of %d requests not served by a pod: %s", res.total-ok, res.total, res)
	}
	if got := metric(t, w, "steelyard_ingress_nginx_reloads_total"); got != reloads {
		t.Errorf("nginx reloaded %v times during endpoint churn, want 0", got-reloads)
	}
	if got := metric(t, w, "steelyard_ingress_nginx_config_hash"); got != hash {
		t.Error("config hash changed during endpoint churn")
	}
	t.Logf("reloads during churn: %v", metric(t, w, "steelyard_ingress_nginx_reloads_total")-reloads)
}

// TestNginxRestart: nginx killed with SIGKILL is started again by the
// agent, the event is logged and counted, and requests are served again.
func TestNginxRestart(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	addPods(t, w, map[string]string{"r1": "198.19.8.2"})
	must(t, w.Service(ctx, "restart", "198.18.1.60", nil))
	must(t, w.SetEndpoints(ctx, "restart", "r1"))
	must(t, w.Apply(ctx, harness.IngressOf("restart", harness.Rule{Host: "restart.example", Paths: []harness.Path{{Path: "/", Type: prefix, Service: "restart"}}})))
	startAgent(t, w)
	eventually(t, 20*time.Second, "restart.example served", func() string {
		if got := answer(w.Get("restart.example", "/", nil)); got != "r1" {
			return got
		}
		return ""
	})
	pid, err := w.NginxPid()
	must(t, err)
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	killed := time.Now()
	eventually(t, 30*time.Second, "nginx serving again", func() string {
		if got := answer(w.Get("restart.example", "/", nil)); got != "r1" {
			return got
		}
		if p, err := w.NginxPid(); err != nil || p == pid {
			return fmt.Sprintf("pid file: %d %v", p, err)
		}
		return ""
	})
	t.Logf("serving again %v after SIGKILL of nginx %d", time.Since(killed).Round(time.Millisecond), pid)
	if got := metric(t, w, "steelyard_ingress_nginx_restarts_total"); got != 1 {
		t.Errorf("restarts metric %v, want 1", got)
	}
	if !strings.Contains(w.Agent.Log(), "nginx exited; starting it again") {
		t.Error("the restart is not in the agent's log")
	}
	// The killed master's workers do not linger with the ports.
	eventually(t, 5*time.Second, "the killed nginx's workers gone", func() string {
		if left := harness.NginxGroup(pid); len(left) > 0 {
			return fmt.Sprint("still running: ", left)
		}
		return ""
	})
	// Stopping the agent stops nginx, workers included.
	newPid, err := w.NginxPid()
	must(t, err)
	must(t, w.Agent.Stop())
	eventually(t, 5*time.Second, "nginx gone with the agent", func() string {
		if left := harness.NginxGroup(newPid); len(left) > 0 {
			return fmt.Sprint("still running: ", left)
		}
		return ""
	})
}
