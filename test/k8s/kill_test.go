//go:build k8s

package k8s

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Kill test sizes.
const (
	bulkServices  = 300
	bulkEndpoints = 3
	kills         = 20
)

// bulkVIP is the VIP of bulk Service i: 198.18.1.1-250, then 198.18.2.1-.
func bulkVIP(i int) string {
	return fmt.Sprintf("198.18.%d.%d", 1+i/250, 1+i%250)
}

// bulkBackend is endpoint j of bulk Service i: 198.19.64.0 + 4i+j+1, a pod
// that does not exist (these Services only make the ruleset large).
func bulkBackend(i, j int) backend {
	base := binary.BigEndian.Uint32([]byte{198, 19, 64, 0}) + uint32(4*i+j+1)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], base)
	return backend{fmt.Sprintf("bulk-%03d-%d", i, j), netip.AddrFrom4(b).String()}
}

// TestKillDuringSync SIGKILLs the agent 20 times while a stream of weight
// changes keeps it syncing a few hundred Services, and checks after each
// kill that the kernel holds the complete ruleset of one state the API
// server went through (never parts of two), that verify --kubeconfig
// agrees, and that neither the kills nor the restarts disturb established
// or new connections through an unchanged VIP (no flush).
//
// The change stream updates one Service annotation at a time, from one
// goroutine, so the states the API server goes through form a sequence
// S0, S1, ... (Sk = after k updates) and the agent's informer cache is
// always one of them. A sync applies the whole Sk it read in one
// iptables-restore, so after a kill the kernel must equal Expected(Sk)
// for one k (at or after the round's start): each live VIP is compared with
// the views each of its values renders to, and the sets of k that match
// must intersect. Updates hit Services in random order, while restore text
// is ordered by chain, so a partially applied restore would match no k.
//
// Kill moments rotate through four modes: at a random moment of the change
// stream; just after a kernel write of the agent begins (to land inside
// it: an iptables-restore or nft child appears, or, in nftables mode, the
// agent logs "committing" before a netlink transaction, which the kernel
// applies inside one system call, so the kill lands right after it or
// between it and the end of the sync); up to 0.7 s after the stream
// stopped (inside the last syncs or after them, when the kernel may hold
// the newest state); and at a random moment of the agent's start-up
// (informer list and first, full sync).
func TestKillDuringSync(t *testing.T) {
	e := newEnv(t)
	const echoVIP = "198.18.0.40"
	e1, e2 := backend{"e1", "198.19.4.2"}, backend{"e2", "198.19.4.3"}
	e.addPods(e1, e2)
	e.create(newService("echo", echoVIP, map[string]string{weightsKey: "e1=1,e2=1"}, nil), newSlice("echo", nil, e1, e2))

	// The bulk Services, created by 8 writers.
	svcs := make([]*corev1.Service, bulkServices)
	slices := make([]*discoveryv1.EndpointSlice, bulkServices)
	randomWeights := func(i int) string {
		w := make([]int, bulkEndpoints)
		for {
			for j := range w {
				w[j] = 1 + rand.IntN(100)
			}
			if !onRoundingBoundary(w) {
				break
			}
		}
		parts := make([]string, bulkEndpoints)
		for j := range parts {
			parts[j] = fmt.Sprintf("%s=%d", bulkBackend(i, j).pod, w[j])
		}
		return strings.Join(parts, ",")
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, bulkServices)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < bulkServices; i += 8 {
				name := fmt.Sprintf("bulk-%03d", i)
				var bs []backend
				for j := 0; j < bulkEndpoints; j++ {
					bs = append(bs, bulkBackend(i, j))
				}
				svc, err := e.admin.CoreV1().Services(testNS).Create(context.Background(),
					newService(name, bulkVIP(i), map[string]string{weightsKey: randomWeights(i)}, nil), metav1.CreateOptions{})
				if err != nil {
					errs <- err
					return
				}
				sl, err := e.admin.DiscoveryV1().EndpointSlices(testNS).Create(context.Background(), newSlice(name, nil, bs...), metav1.CreateOptions{})
				if err != nil {
					errs <- err
					return
				}
				svcs[i], slices[i] = svc, sl
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("created %d Services with %d endpoints each in %v", bulkServices, bulkEndpoints, time.Since(start).Round(time.Millisecond))

	e.startAgent(e.cp.Kubeconfig, "--log-level", killLogLevel())
	e.waitVerify(30 * time.Second)
	// The VIPs that never change (echo, the default kubernetes Service).
	fixed := map[string]dataplane.ServiceView{}
	bulkKey := map[string]int{}
	for i := 0; i < bulkServices; i++ {
		bulkKey[vipPort(bulkVIP(i)).String()+"/TCP"] = i
	}
	for _, v := range e.explain() {
		if _, ok := bulkKey[v.Key()]; !ok {
			fixed[v.Key()] = v
		}
	}
	t.Logf("the kernel holds %d bulk VIPs and %d others", bulkServices, len(fixed))

	conn, err := e.client.Connect(vipPort(echoVIP), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echoes := 0
	echo := func(when string) {
		t.Helper()
		if err := conn.Echo(when, 2*time.Second); err != nil {
			t.Errorf("established connection via %s, %s: %v", echoVIP, when, err)
		}
		echoes++
	}
	echo("before the first kill")

	// New connections to the echo VIP all along: 50 a second.
	probe := e.client.StartProber(vipPort(echoVIP), 20*time.Millisecond, time.Second)
	defer probe.Stop()

	h := newHistory(svcs, slices)
	var (
		inRestore, newest, maxBehind int
		restarts                     []time.Duration
		// held is the state the kernel was last seen to hold.
		held = 0
	)
	for round := 1; round <= kills; round++ {
		mode := []string{"random", "in-restore", "after-burst", "start-up"}[(round-1)%4]
		t0 := time.Now()
		a := e.agent
		if round > 1 { // the first round kills the agent started above
			if a, err = e.sb.StartAgent(steelyardBin, e.agentArgs(e.cp.Kubeconfig, "--log-level", killLogLevel())...); err != nil {
				t.Fatal(err)
			}
			e.agent = a
			if mode != "start-up" {
				e.waitSynced(a, 30*time.Second)
				restarts = append(restarts, time.Since(t0))
				echo(fmt.Sprintf("after restart %d", round))
			}
		}
		// The earliest state the kernel may hold at the kill: the one the
		// restarted agent synced (the latest), or, when it may be killed
		// before its first sync, the one the previous kill left.
		from := h.len() - 1
		if mode == "start-up" {
			from = held
		}

		// The change stream, until the kill (or shortly before it).
		stop := make(chan struct{})
		changerDone := make(chan error, 1)
		go func() {
			changerDone <- h.changeUntil(e, stop, randomWeights)
		}()
		stopChanges := sync.OnceValue(func() error {
			close(stop)
			return <-changerDone
		})

		switch mode {
		case "random":
			time.Sleep(time.Duration(50+rand.IntN(1450)) * time.Millisecond)
		case "in-restore":
			time.Sleep(time.Duration(50+rand.IntN(750)) * time.Millisecond)
			deadline := time.Now().Add(3 * time.Second)
			commits := newLogWatch(a.LogPath)
			for !restoreRunning(a.Pid()) && time.Now().Before(deadline) {
				if agentMode == "nftables" {
					// The netlink write follows the log line within
					// microseconds: no sleep, no added jitter.
					if commits.seen("msg=committing") {
						break
					}
					continue
				}
				time.Sleep(500 * time.Microsecond)
			}
			if agentMode != "nftables" {
				time.Sleep(time.Duration(rand.IntN(5000)) * time.Microsecond)
			}
		case "after-burst":
			time.Sleep(time.Duration(50+rand.IntN(750)) * time.Millisecond)
			if err := stopChanges(); err != nil {
				t.Fatalf("change stream: %v", err)
			}
			time.Sleep(time.Duration(rand.IntN(700)) * time.Millisecond)
		case "start-up":
			time.Sleep(time.Until(t0.Add(time.Duration(rand.IntN(1500)) * time.Millisecond)))
		}
		restoring := restoreRunning(a.Pid())
		syscall.Kill(a.Pid(), syscall.SIGKILL)
		<-a.Done()
		killedAt := time.Since(t0)
		restoring = restoring || inCommit(a.Log())
		if err := stopChanges(); err != nil {
			t.Fatalf("change stream: %v", err)
		}
		if restoring {
			inRestore++
		}
		// An iptables-restore the agent started finishes (or fails) on its
		// own; look at the kernel once nothing runs in the node namespace.
		sandbox.Poll(t, 10*time.Second, 5*time.Millisecond, "the node namespace to empty", func() (bool, string) {
			pids := nsPids(e.sb.Node.Name)
			return len(pids) == 0, fmt.Sprintf("processes %v", pids)
		})

		live := e.explain()
		match, detail := h.match(live, fixed, bulkKey, from)
		held = max(match, 0)
		out, code := e.verify()
		n := h.len() - 1
		switch {
		case match < 0:
			t.Errorf("kill %d (%s, %v after start, kernel write in flight: %v): the kernel matches no single state S%d..S%d:\n%s",
				round, mode, killedAt.Round(time.Millisecond), restoring, from, n, detail)
		case match == n:
			newest++
			if code != 0 {
				t.Errorf("kill %d: the kernel holds the latest state S%d but verify --kubeconfig fails:\n%s", round, n, out)
			}
		default:
			maxBehind = max(maxBehind, n-match)
			if code != 1 {
				t.Errorf("kill %d: the kernel holds S%d, not the latest S%d, but verify --kubeconfig exits %d:\n%s", round, match, n, code, out)
			}
		}
		t.Logf("kill %2d (%-12s %6v after start, kernel write in flight: %-5v): kernel holds S%d of S%d..S%d; verify exit %d",
			round, mode+",", killedAt.Round(time.Millisecond), restoring, match, from, n, code)
		echo(fmt.Sprintf("after kill %d", round))
	}

	t0 := time.Now()
	e.startAgent(e.cp.Kubeconfig, "--log-level", killLogLevel())
	restarts = append(restarts, time.Since(t0))
	took := e.waitVerify(30 * time.Second)
	echo("after the last restart")
	probeOK, probeErrs := probe.Stop()

	t.Logf("%d kills: %d with a kernel write of the agent in flight, kernel held the newest state %d times, at most %d changes behind otherwise; %d changes in all",
		kills, inRestore, newest, maxBehind, h.len()-1)
	sort.Slice(restarts, func(i, j int) bool { return restarts[i] < restarts[j] })
	t.Logf("restart -> first sync: median %v, max %v; verify passed %v after the last restart",
		restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond), took.Round(time.Millisecond))
	logSyncTimes(t, e.sb.Agents())
	t.Logf("established connection: %d echoes, all answered; new connections to %s during kills and restarts: %d ok, %d failed",
		echoes, echoVIP, probeOK, len(probeErrs))
	if len(probeErrs) > 0 {
		t.Errorf("%d new connections to the unchanged VIP failed:\n%s", len(probeErrs), strings.Join(probeErrs, "\n"))
	}
	if inRestore == 0 {
		t.Errorf("no kill landed while a kernel write was in flight: the test did not exercise what it is for")
	}
}

// history records the sequence of states of the bulk Services' weights
// annotations: S0 is the initial state, Sk the state after k updates.
type history struct {
	svcs   []*corev1.Service
	slices []*discoveryv1.EndpointSlice
	// values[i] lists the annotation values of Service i and the state
	// each took effect in, oldest first.
	values [][]valueFrom
	n      int // number of states
	views  map[string]dataplane.ServiceView
}

type valueFrom struct {
	state int
	value string
}

func newHistory(svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) *history {
	h := &history{svcs: svcs, slices: slices, values: make([][]valueFrom, len(svcs)), n: 1, views: map[string]dataplane.ServiceView{}}
	for i, s := range svcs {
		h.values[i] = []valueFrom{{0, s.Annotations[weightsKey]}}
	}
	return h
}

// len returns the number of states so far (the latest is S(len-1)).
func (h *history) len() int { return h.n }

// changeUntil updates the weights of random Services, one at a time, until
// stop is closed, recording each state. An update in flight when stop
// closes completes and is recorded.
func (h *history) changeUntil(e *env, stop <-chan struct{}, weights func(int) string) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		i := rand.IntN(len(h.svcs))
		svc := h.svcs[i].DeepCopy()
		svc.Annotations[weightsKey] = weights(i)
		updated, err := e.admin.CoreV1().Services(testNS).Update(context.Background(), svc, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		h.svcs[i] = updated
		h.values[i] = append(h.values[i], valueFrom{h.n, updated.Annotations[weightsKey]})
		h.n++
	}
}

// view returns the explain view Service i renders to with weights value.
func (h *history) view(i int, value string) dataplane.ServiceView {
	key := strconv.Itoa(i) + " " + value
	if v, ok := h.views[key]; ok {
		return v
	}
	svc := h.svcs[i].DeepCopy()
	svc.Annotations[weightsKey] = value
	state, problems := controller.NewBuilder().Build([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{h.slices[i]})
	views := dataplane.Expected(state)
	if len(problems) > 0 || len(views) != 1 {
		panic(fmt.Sprintf("bulk Service %d with %q: %d views, problems %v", i, value, len(views), problems))
	}
	h.views[key] = views[0]
	return views[0]
}

// match returns the latest state k >= lo whose complete ruleset the live
// views show, or -1 and a description of the mix.
func (h *history) match(live []dataplane.ServiceView, fixed map[string]dataplane.ServiceView, bulkKey map[string]int, lo int) (int, string) {
	ok := make([]bool, h.n) // ok[k]: every VIP seen so far agrees with Sk
	for k := lo; k < h.n; k++ {
		ok[k] = true
	}
	var notes []string
	seen := map[string]bool{}
	for _, v := range live {
		seen[v.Key()] = true
		i, isBulk := bulkKey[v.Key()]
		if !isBulk {
			if want, ok := fixed[v.Key()]; !ok {
				notes = append(notes, "unexpected VIP "+v.Line())
			} else if d := dataplane.Diff([]dataplane.ServiceView{want}, []dataplane.ServiceView{v}); len(d) > 0 {
				notes = append(notes, strings.Join(d, "\n"))
			}
			continue
		}
		// The states in which VIP i agrees with the kernel.
		vals := h.values[i]
		var agree []string
		for x, vf := range vals {
			end := h.n
			if x+1 < len(vals) {
				end = vals[x+1].state
			}
			if end <= lo {
				continue
			}
			same := len(dataplane.Diff([]dataplane.ServiceView{h.view(i, vf.value)}, []dataplane.ServiceView{v})) == 0
			if same {
				agree = append(agree, fmt.Sprintf("S%d..S%d", max(vf.state, lo), end-1))
				continue
			}
			for k := max(vf.state, lo); k < end; k++ {
				ok[k] = false
			}
		}
		if len(agree) == 0 {
			notes = append(notes, fmt.Sprintf("%s matches none of its values since S%d: %s", v.Key(), lo, v.Line()))
		} else if len(notes) < 40 {
			notes = append(notes, fmt.Sprintf("%s agrees with %s", v.Key(), strings.Join(agree, ", ")))
		}
	}
	for k := range bulkKey {
		if !seen[k] {
			notes = append(notes, "missing from the kernel: "+k)
			return -1, strings.Join(notes, "\n")
		}
	}
	for k := range fixed {
		if !seen[k] {
			notes = append(notes, "missing from the kernel: "+k)
			return -1, strings.Join(notes, "\n")
		}
	}
	for k := h.n - 1; k >= lo; k-- {
		if ok[k] {
			return k, ""
		}
	}
	return -1, strings.Join(notes, "\n")
}

// onRoundingBoundary tells whether a share of weights w, in percent, has a
// 5 in its fifth decimal and nothing after it (weights 87/39/2, sum 128:
// 67.96875%). explain rebuilds that share from the kernel's 31-bit
// probabilities as 67.9687499..., which rounds to 67.9687 while the desired
// share rounds to 67.9688; the two differ by the rounding step, which is
// also dataplane.ShareTolerance, so verify reports a false MISMATCH (about
// 0.3% of weight triples from 1 to 100). Reported as a bug; the test draws
// around it so that its verify checks are about kills, not rounding.
func onRoundingBoundary(w []int) bool {
	total := 0
	for _, x := range w {
		total += x
	}
	for _, x := range w {
		// share * 1e4 = 1e6 * x / total; a boundary is an odd multiple of
		// one half.
		if (2_000_000*x)%total == 0 && (2_000_000*x/total)%2 == 1 {
			return true
		}
	}
	return false
}

// restoreRunning tells whether process pid has a child that writes the
// kernel in one transaction: iptables-restore, or nft in nftables mode.
func restoreRunning(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, c := range strings.Fields(string(b)) {
			cmd, err := os.ReadFile("/proc/" + c + "/cmdline")
			arg0 := strings.SplitN(string(cmd), "\x00", 2)[0]
			if err == nil && (strings.Contains(arg0, "restore") || agentMode == "nftables" && filepath.Base(arg0) == "nft") {
				return true
			}
		}
	}
	return false
}

// killLogLevel is the agents' log level: debug in nftables mode, whose
// netlink writes are seen only through the agent's "committing" lines.
func killLogLevel() string {
	if agentMode == "nftables" {
		return "debug"
	}
	return "info"
}

// inCommit tells whether an nftables agent's log ends inside a sync's
// kernel write: a "committing" line with no "synced" line after it.
func inCommit(log string) bool {
	c := strings.LastIndex(log, "msg=committing")
	return c >= 0 && strings.LastIndex(log, "msg=synced") < c
}

// logWatch reads what a log file gains after the watch began.
type logWatch struct {
	path string
	off  int64
}

func newLogWatch(path string) *logWatch {
	w := &logWatch{path: path}
	if fi, err := os.Stat(path); err == nil {
		w.off = fi.Size()
	}
	return w
}

// seen tells whether the log gained a line containing s since the watch
// began (or since the last call that read a whole line).
func (w *logWatch) seen(s string) bool {
	f, err := os.Open(w.path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 64<<10)
	n, _ := f.ReadAt(b, w.off)
	b = b[:n]
	// Only whole lines: a line being written is read again next time.
	end := strings.LastIndexByte(string(b), '\n')
	if end < 0 {
		return false
	}
	w.off += int64(end + 1)
	return strings.Contains(string(b[:end]), s)
}

// nsPids returns the processes inside the named network namespace.
func nsPids(name string) []string {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return []string{"(ip netns pids: " + err.Error() + ")"}
	}
	return strings.Fields(string(out))
}

var tookRE = regexp.MustCompile(`msg=synced.* full=(true|false) .*took=([0-9.]+[µnm]?s)`)

// logSyncTimes logs the durations of the syncs in the agents' logs.
func logSyncTimes(t *testing.T, agents []*sandbox.Agent) {
	t.Helper()
	byKind := map[string][]time.Duration{}
	for _, a := range agents {
		for _, m := range tookRE.FindAllStringSubmatch(a.Log(), -1) {
			if d, err := time.ParseDuration(m[2]); err == nil {
				kind := "partial"
				if m[1] == "true" {
					kind = "full"
				}
				byKind[kind] = append(byKind[kind], d)
			}
		}
	}
	for _, kind := range []string{"full", "partial"} {
		ds := byKind[kind]
		if len(ds) == 0 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s syncs: %d, median %v, max %v", kind, len(ds), ds[len(ds)/2].Round(100*time.Microsecond), ds[len(ds)-1].Round(100*time.Microsecond))
	}
}
