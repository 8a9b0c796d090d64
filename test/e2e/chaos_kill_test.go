//go:build e2e

package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// kernelTool is the program the agent of mode m execs to write the kernel:
// the child a kill should land inside.
func kernelTool(m dpMode) string {
	if m.flavour != "" {
		return "iptables-" + m.flavour + "-restore"
	}
	return "nft"
}

// toolChild returns the PID of a child of pid whose program is named name,
// or 0. It reads only pid's own children lists (a scan of all of /proc
// takes milliseconds, as long as a small restore).
func toolChild(pid int, name string) int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			cmd, _ := os.ReadFile("/proc/" + f + "/cmdline")
			if argv0, _, _ := strings.Cut(string(cmd), "\x00"); filepath.Base(argv0) == name {
				c, _ := strconv.Atoi(f)
				return c
			}
		}
	}
	return 0
}

// writeAtomic writes the Services to file of dir through a hidden temporary
// file and a rename (the agent skips hidden files), so the agent never reads
// half a generation.
func (f *fixture) writeAtomic(dir, file string, services ...svc) {
	f.t.Helper()
	saved := f.dir
	f.dir = dir
	f.write(".tmp-"+file, services...)
	f.dir = saved
	if err := os.Rename(filepath.Join(dir, ".tmp-"+file), filepath.Join(dir, file)); err != nil {
		f.t.Fatal(err)
	}
}

// TestChaosKill SIGKILLs the agent CHAOS_KILLS times (100 by default) per
// dataplane at random points of its syncs, with CHAOS_SERVICES bulk
// Services (100 by default, 2 endpoints each) whose every endpoint chain
// changes from one generation to the next, and with real traffic through an
// unchanged Service all along:
//   - after each kill (once the kernel tool the agent may have left behind
//     is done), verify passes against the old or the new generation: the
//     kernel holds one complete state, never parts of two;
//   - the agent is restarted without a flush: an established connection
//     through the unchanged VIP answers after every kill and restart, and
//     new connections to it (one every 20 ms, from before the first kill
//     to after the last restart) all succeed.
//
// Kill moments rotate through three kinds: a random moment after a new
// generation is written (0-300 ms: before, inside or after its sync); just
// after the agent's kernel tool (iptables-restore, nft) appears, plus
// 0-15 ms, so that the kill lands inside the write; and a random moment of
// the restart itself (0-300 ms after exec: manifests load, first full
// sync of the generation the previous kill left unapplied).
func TestChaosKill(t *testing.T) {
	kills := envInt("CHAOS_KILLS", 100)
	n := envInt("CHAOS_SERVICES", 100)
	for _, m := range dpModes {
		t.Run(m.name, func(t *testing.T) { chaosKill(t, m, kills, n) })
	}
}

func chaosKill(t *testing.T, m dpMode, kills, n int) {
	f := newFixture(t, m)
	f.addPods(webService)
	f.write("web.yaml", webService)
	// The generation directories verify compares the kernel with: web plus
	// the bulk Services of that generation.
	genDirs := map[int]string{}
	genDir := func(gen int) string {
		if d, ok := genDirs[gen]; ok {
			return d
		}
		d := t.TempDir()
		saved := f.dir
		f.dir = d
		f.write("web.yaml", webService)
		f.write("many.yaml", manyServices(n, gen%2)...)
		f.dir = saved
		genDirs[gen] = d
		return d
	}
	verifyGen := func(gen int) (string, int) {
		stdout, stderr, err := f.sb.Node.Exec2(append([]string{steelyardBin, "verify", "--manifests", genDir(gen % 2)}, m.args...)...)
		return stdout + stderr, sandbox.ExitCode(err)
	}
	gen := 0 // the generation on disk
	f.writeAtomic(f.dir, "many.yaml", manyServices(n, gen)...)
	args := append([]string{"run", "--manifests", f.dir, "--cluster-cidr", sandbox.ClusterCIDR.String(),
		"--metrics-bind-address", "", "--healthz-bind-address", "", "--log-level", "info"}, m.args...)
	start := func() *sandbox.Agent {
		t.Helper()
		a, err := f.sb.StartAgent(steelyardBin, args...)
		if err != nil {
			t.Fatal(err)
		}
		f.agent = a
		return a
	}
	waitSynced := func(a *sandbox.Agent) time.Duration {
		t.Helper()
		t0 := time.Now()
		for !agentSynced(a.Log()) {
			if exited, err := a.Exited(); exited {
				t.Fatalf("agent exited: %v\n%s", err, a.Log())
			}
			if time.Since(t0) > 30*time.Second {
				t.Fatalf("no first sync 30 s after start:\n%s", a.Log())
			}
			time.Sleep(2 * time.Millisecond)
		}
		return time.Since(t0)
	}
	a := start()
	first := waitSynced(a)
	if out, code := verifyGen(gen); code != 0 {
		t.Fatalf("verify after the first sync: exit %d\n%s", code, out)
	}
	t.Logf("%s: first sync of %d Services %s after start", m.name, n+1, first.Round(time.Millisecond))
	nodeNS, err := sandbox.NetnsOf("/run/netns/" + f.sb.Node.Name)
	if err != nil {
		t.Fatal(err)
	}

	vip := addrPort(webService.vip, webService.port)
	conn, err := f.client.Connect(vip, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echoes := 0
	echo := func(when string) {
		t.Helper()
		if err := conn.Echo(when, 2*time.Second); err != nil {
			t.Errorf("established connection via %s, %s: %v", vip, when, err)
		}
		echoes++
	}

	// New connections to the unchanged VIP all along: 50 a second.
	probe := f.client.StartProber(vip, 20*time.Millisecond, time.Second)
	defer probe.Stop()

	var (
		began             = time.Now()
		held              = gen // the generation the kernel holds
		inTool, heldNew   int
		restarts, killAts []time.Duration
		kinds             = []string{"random", "in-tool", "start-up"}
	)
	for round := 1; round <= kills; round++ {
		kind := kinds[(round-1)%len(kinds)]
		t0 := time.Now()
		if round > 1 {
			a = start()
			if kind != "start-up" {
				restarts = append(restarts, waitSynced(a))
				held = gen
				echo(fmt.Sprintf("after restart %d", round))
			}
		}
		if kind != "start-up" {
			gen++
			f.writeAtomic(f.dir, "many.yaml", manyServices(n, gen%2)...)
			t0 = time.Now()
		}
		switch kind {
		case "random":
			time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		case "in-tool":
			deadline := time.Now().Add(3 * time.Second)
			for toolChild(a.Pid(), kernelTool(m)) == 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			if time.Now().After(deadline) {
				t.Logf("kill %d: no %s within 3 s of the change", round, kernelTool(m))
			}
			time.Sleep(time.Duration(rand.IntN(15000)) * time.Microsecond)
		case "start-up":
			time.Sleep(time.Until(t0.Add(time.Duration(rand.IntN(300)) * time.Millisecond)))
		}
		toolRunning := toolChild(a.Pid(), kernelTool(m)) != 0
		syscall.Kill(a.Pid(), syscall.SIGKILL)
		<-a.Done()
		killAt := time.Since(t0)
		killAts = append(killAts, killAt)
		if toolRunning {
			inTool++
		}
		// A kernel tool the agent started may outlive it (nft has no
		// Pdeathsig); look at the kernel once it is done.
		var left []string
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
			if left, _ = sandbox.ProcessesIn(nodeNS); len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Fatalf("kill %d: processes still in the node namespace 10 s after the kill: %v", round, left)
		}
		outOld, codeOld := verifyGen(held)
		switch {
		case codeOld == 0:
		case gen != held:
			outNew, codeNew := verifyGen(gen)
			if codeNew != 0 {
				t.Errorf("kill %d (%s, %s after the change/start, %s running: %v): the kernel holds neither generation %d nor %d:\n%.3000s\n---\n%.3000s",
					round, kind, killAt.Round(time.Millisecond), kernelTool(m), toolRunning, held, gen, outOld, outNew)
			} else {
				held = gen
				heldNew++
			}
		default:
			t.Errorf("kill %d (%s, %s after start): the kernel no longer holds generation %d:\n%.3000s", round, kind, killAt.Round(time.Millisecond), held, outOld)
		}
		if t.Failed() {
			break
		}
		echo(fmt.Sprintf("after kill %d", round))
	}
	a = start()
	restarts = append(restarts, waitSynced(a))
	recovered := time.Now()
	if out, code := verifyGen(gen); code != 0 {
		t.Errorf("verify after the last restart: exit %d\n%s", code, out)
	}
	echo("after the last restart")
	probeOK, probeErrs := probe.Stop()

	sort.Slice(restarts, func(i, j int) bool { return restarts[i] < restarts[j] })
	sort.Slice(killAts, func(i, j int) bool { return killAts[i] < killAts[j] })
	t.Logf("%s: %d kills in %s (%d Services): %d with %s running, %d left the new generation, the others the old; kill moments %s..%s after the change/start",
		m.name, len(killAts), recovered.Sub(began).Round(time.Millisecond), n+1, inTool, kernelTool(m), heldNew,
		killAts[0].Round(time.Millisecond), killAts[len(killAts)-1].Round(time.Millisecond))
	t.Logf("%s: restart -> first sync: median %s, max %s", m.name, restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond))
	t.Logf("%s: established connection: %d echoes; new connections to %s: %d ok, %d failed", m.name, echoes, vip, probeOK, len(probeErrs))
	if len(probeErrs) > 0 {
		t.Errorf("%d new connections to the unchanged VIP failed:\n%s", len(probeErrs), strings.Join(probeErrs, "\n"))
	}
	if inTool == 0 {
		t.Errorf("no kill landed while %s ran: the test did not exercise what it is for", kernelTool(m))
	}
}
