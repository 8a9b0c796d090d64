//go:build ipvsvm

package ipvs

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// Chaos in IPVS mode (the host kernel has none: the suite runs in the VM).
// Sizes are small because the VM runs under TCG, several times slower than
// the host, and the whole VM run is bounded (scripts/vm/test-ipvs.sh).
const (
	chaosVIP      = "198.18.0.50"
	chaosKills    = 8
	chaosServices = 10
	chaosPeriod   = 2 * time.Second
)

// chaosManifest is the unchanged Service the traffic goes to (two real
// pods) plus n bulk Services whose endpoints (pods that do not exist) all
// change target port from one generation to the next.
func chaosManifest(n, gen int) string {
	var b strings.Builder
	svc := func(name, vip string, port int, eps ...[2]string) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {namespace: chaos, name: %s}
spec:
  type: ClusterIP
  clusterIP: %s
  ports:
    - {name: http, protocol: TCP, port: 80, targetPort: %d}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: chaos
  name: %s-x1
  labels: {kubernetes.io/service-name: %s}
addressType: IPv4
ports:
  - {name: http, protocol: TCP, port: %d}
endpoints:
`, name, vip, port, name, name, port)
		for _, e := range eps {
			fmt.Fprintf(&b, "  - {addresses: [%q], conditions: {ready: true}, targetRef: {kind: Pod, namespace: chaos, name: %s}}\n", e[1], e[0])
		}
	}
	svc("web", chaosVIP, 8080, [2]string{"chaos-a", "198.19.7.2"}, [2]string{"chaos-b", "198.19.7.3"})
	for i := 0; i < n; i++ {
		svc(fmt.Sprintf("bulk-%03d", i), fmt.Sprintf("198.18.3.%d", 1+i), 8080+gen%2,
			[2]string{fmt.Sprintf("bulk-%03d-a", i), fmt.Sprintf("198.19.64.%d", 1+i)},
			[2]string{fmt.Sprintf("bulk-%03d-b", i), fmt.Sprintf("198.19.65.%d", 1+i)})
	}
	return b.String()
}

// TestIPVSChaos: faults of issue 15 in IPVS mode, with new connections to
// an unchanged Service every 50 ms and an established one echoing
// throughout:
//   - sigkill: 8 SIGKILLs at random moments of syncs of a change to 10
//     Services (and of restarts). IPVS programming is one netlink request
//     per service and destination, not a transaction, so after a kill the
//     kernel may hold parts of both generations: the test counts those
//     kills, and requires that the restarted agent (no flush) repairs
//     them, and that no connection to the unchanged Service fails;
//   - sigterm-mid-sync: SIGTERM just inside the sync of a change: the
//     agent exits within 2 s and leaves no process in the node namespace;
//   - ipvsadm-C: another tool deletes every virtual service; the periodic
//     sync (2 s) notices and restores them, and new connections succeed
//     after (an established connection is reset by the node in between:
//     IPVS cannot keep it).
func TestIPVSChaos(t *testing.T) {
	if steelyardBin == "" {
		t.Skip("runs inside the IPVS VM (scripts/vm/test-ipvs.sh); STEELYARD_BIN unset")
	}
	if os.Getenv("IPVS_CHAOS") == "" {
		// Not yet in `make ipvs`: under TCG on a loaded machine its agent
		// restarts took 10-50 s each and it never finished in the VM's
		// time; `make ipvs-chaos` runs it alone with more time.
		t.Skip("IPVS_CHAOS unset (make ipvs-chaos)")
	}
	sb := sandbox.NewT(t, sandbox.Options{})
	client, err := sb.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sb: sb, client: client, dir: t.TempDir()}
	for name, ip := range map[string]string{"chaos-a": "198.19.7.2", "chaos-b": "198.19.7.3"} {
		if _, err := sb.AddPod(name, netip.MustParseAddr(ip), 8080); err != nil {
			t.Fatal(err)
		}
	}
	genDir := map[int]string{0: t.TempDir(), 1: t.TempDir()}
	for g, d := range genDir {
		if err := os.WriteFile(filepath.Join(d, "chaos.yaml"), []byte(chaosManifest(chaosServices, g)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gen := 0
	writeGen := func(g int) {
		t.Helper()
		tmp := filepath.Join(f.dir, ".chaos.yaml.tmp") // hidden: the agent skips it
		if err := os.WriteFile(tmp, []byte(chaosManifest(chaosServices, g)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(f.dir, "chaos.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	verifyGen := func(g int) (string, bool) {
		out, err := f.steelyard("verify", "--manifests", genDir[g%2], "--mode", "ipvs")
		return out, err == nil
	}
	writeGen(gen)
	start := func() *sandbox.Agent {
		t.Helper()
		a, err := sb.StartAgent(steelyardBin, "run", "--manifests", f.dir, "--mode", "ipvs",
			"--cluster-cidr", sandbox.ClusterCIDR.String(), "--sync-period", chaosPeriod.String(), "--log-level", "info",
			"--metrics-bind-address", "", "--healthz-bind-address", "")
		if err != nil {
			t.Fatal(err)
		}
		f.agent = a
		return a
	}
	waitSynced := func(a *sandbox.Agent) time.Duration {
		t.Helper()
		t0 := time.Now()
		for !strings.Contains(a.Log(), "msg=synced") {
			if exited, err := a.Exited(); exited {
				t.Fatalf("agent exited: %v\n%s", err, a.Log())
			}
			if time.Since(t0) > 60*time.Second {
				t.Fatalf("no first sync 60 s after start:\n%s", a.Log())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(t0)
	}
	waitEmpty := func(what string) {
		t.Helper()
		var left []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if left, err = sb.Node.Processes(); err != nil || len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(left) > 0 {
			t.Errorf("%s: processes left in the node namespace: %v", what, left)
		}
	}
	a := start()
	t.Logf("first sync of %d Services %s after start", chaosServices+1, waitSynced(a).Round(time.Millisecond))
	f.waitVerify(30 * time.Second)

	vip := netip.AddrPortFrom(netip.MustParseAddr(chaosVIP), 80)
	conn, err := client.Connect(vip, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	probe := client.StartProber(vip, 50*time.Millisecond, 2*time.Second)
	defer probe.Stop()

	t.Run("sigkill", func(t *testing.T) {
		var mixed, heldNew int
		var restarts []time.Duration
		for round := 1; round <= chaosKills; round++ {
			startUp := round%4 == 0
			t0 := time.Now()
			if round > 1 {
				a = start()
				if !startUp {
					restarts = append(restarts, waitSynced(a))
				}
			}
			if !startUp {
				gen++
				writeGen(gen)
				t0 = time.Now()
			}
			time.Sleep(time.Until(t0.Add(time.Duration(rand.IntN(2000)) * time.Millisecond)))
			syscall.Kill(a.Pid(), syscall.SIGKILL)
			<-a.Done()
			killAt := time.Since(t0)
			waitEmpty(fmt.Sprintf("kill %d", round))
			state := "new"
			if _, ok := verifyGen(gen); ok {
				heldNew++
			} else if _, ok := verifyGen(gen - 1); ok {
				state = "old"
			} else {
				state = "mixed"
				mixed++
			}
			t.Logf("kill %2d (%s, %s after the change/start): kernel holds the %s generation", round, map[bool]string{true: "start-up", false: "sync"}[startUp], killAt.Round(time.Millisecond), state)
			if err := conn.Echo(fmt.Sprintf("after kill %d", round), 3*time.Second); err != nil {
				t.Errorf("established connection after kill %d: %v", round, err)
			}
		}
		t0 := time.Now()
		a = start()
		restarts = append(restarts, waitSynced(a))
		f.waitVerify(30 * time.Second)
		repaired := time.Since(t0)
		sort.Slice(restarts, func(i, j int) bool { return restarts[i] < restarts[j] })
		t.Logf("%d kills: %d left the new generation, %d a mix of both (repaired by the restart); restart -> first sync median %s, max %s; verify passed %s after the last restart",
			chaosKills, heldNew, mixed, restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond), repaired.Round(time.Millisecond))
	})

	t.Run("sigterm-mid-sync", func(t *testing.T) {
		for round := 1; round <= 3; round++ {
			st := stampLog(a.LogPath)
			gen++
			writeGen(gen)
			changed := time.Now()
			time.Sleep(time.Duration(250+rand.IntN(100)) * time.Millisecond)
			sent := time.Now()
			a.Stop()
			took := time.Since(sent)
			time.Sleep(20 * time.Millisecond)
			st.Stop()
			t.Logf("round %d: agent exited %s after SIGTERM (sent %s after the change); its log from the change:\n%s", round, took.Round(time.Millisecond),
				sent.Sub(changed).Round(time.Millisecond), strings.Join(st.since(changed), "\n"))
			if took > 2*time.Second {
				t.Errorf("agent took %s to exit after SIGTERM, want at most 2 s", took.Round(time.Millisecond))
			}
			waitEmpty("after SIGTERM")
			a = start()
			waitSynced(a)
			f.waitVerify(30 * time.Second)
		}
	})
	if err := conn.Echo("after the kills and restarts", 3*time.Second); err != nil {
		t.Errorf("established connection after the kills and restarts: %v", err)
	}
	probeOK, probeErrs := probe.Stop()
	t.Logf("new connections to %s during kills and restarts: %d ok, %d failed", vip, probeOK, len(probeErrs))
	if len(probeErrs) > 0 {
		t.Errorf("%d new connections to the unchanged Service failed:\n%s", len(probeErrs), strings.Join(probeErrs, "\n"))
	}

	t.Run("ipvsadm-C", func(t *testing.T) {
		for round := 1; round <= 3; round++ {
			st := stampLog(a.LogPath)
			est, err := client.Connect(vip, 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			p := client.StartProber(vip, 50*time.Millisecond, 2*time.Second)
			time.Sleep(300 * time.Millisecond)
			before := time.Now()
			if out, err := sb.Node.Exec("ipvsadm", "-C"); err != nil {
				t.Fatalf("ipvsadm -C: %v\n%s", err, out)
			}
			flushed := time.Now()
			lnc, _ := sb.Node.Exec("ipvsadm", "-Lnc")
			lncAt := time.Since(before)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if _, ok := verifyGen(gen); ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not repaired after 30 s")
				}
			}
			repaired := time.Since(before)
			estErr := est.Echo("after flush", 3*time.Second)
			time.Sleep(500 * time.Millisecond)
			pok, perrs := p.Stop()
			r, err := client.TCPConns(vip, 50, sandbox.Load{})
			if err != nil {
				t.Fatal(err)
			}
			lnc2, _ := sb.Node.Exec("ipvsadm", "-Lnc")
			st.Stop()
			t.Logf("round %d: ipvsadm -C at %s (took %s); ipvsadm -Lnc %s after: %d entries; verify passed %s after; established: %v; prober %d ok, failures %v; 50 new after: %s; ipvsadm -Lnc then %d entries\nagent log:\n%s",
				round, before.Format("15:04:05.000"), flushed.Sub(before).Round(time.Millisecond), lncAt.Round(time.Millisecond), strings.Count(lnc, "\n")-2,
				repaired.Round(time.Millisecond), estErr, pok, perrs, r, strings.Count(lnc2, "\n")-2, strings.Join(st.since(before.Add(-time.Second)), "\n"))
			if r.Failed() > 0 {
				t.Errorf("%d of 50 new connections failed after the repair: %v\n%s", r.Failed(), r.Errors, lnc2)
			}
			est.Close()
		}
	})
	a.Stop()
}
