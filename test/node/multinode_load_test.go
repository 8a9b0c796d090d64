//go:build node && multinode

package node

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/node/cluster"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// pinnedPods is the YAML of netexec pods (cluster.NetexecPodSpec) called
// names[i], labelled app, each bound to node nodes[i].
func pinnedPods(app string, names, nodes []string) string {
	spec := strings.ReplaceAll(cluster.NetexecPodSpec, "\n    ", "\n")
	var docs []string
	for i, name := range names {
		docs = append(docs, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, labels: {app: %s}}
spec:
  nodeName: %s`, name, app, nodes[i])+spec)
	}
	return strings.Join(docs, "---\n")
}

// spreadDeployment is the YAML of a Deployment of n netexec pods labelled
// app, at most one more on any node than on another (a topology spread
// over kubernetes.io/hostname; a cordoned node, tainted unschedulable,
// is no domain: nodeTaintsPolicy Honor), and a NodePort Service app on
// port 80.
func spreadDeployment(app string, n int) string {
	return deploymentYAML(app, n, `
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, nodeTaintsPolicy: Honor, labelSelector: {matchLabels: {app: `+app+`}}}`,
		"NodePort")
}

// httpGetIn sends GET path on a new connection from netns to dst and
// returns the status code and body.
func httpGetIn(netns inNS, dst netip.AddrPort, path string, timeout time.Duration) (int, string, error) {
	c, err := dialIn(netns, dst, timeout)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), err
}

// loadSource is one origin of load: new connections from netns to dst.
type loadSource struct {
	who string
	ns  inNS
	dst netip.AddrPort
}

// load runs new connections (one GET /hostname each) from every source,
// two at a time per source, each worker at most loadRate a second, until
// stop is called (at the latest when the test ends), loadLimit has
// passed, or loadMax connections of a source were made. stop waits for
// the workers and returns the outcome per source.
func load(t *testing.T, sources []loadSource) (stop func() []*tally) {
	done := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(done) }) }
	t.Cleanup(end)
	deadline := time.Now().Add(loadLimit)
	tallies := make([]*tally, len(sources))
	var wg sync.WaitGroup
	for i, s := range sources {
		r := &tally{}
		tallies[i] = r
		var mu sync.Mutex
		made := 0
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(time.Second / loadRate)
				defer tick.Stop()
				for {
					select {
					case <-done:
						return
					case <-tick.C:
					}
					mu.Lock()
					made++
					over := made > loadMax
					mu.Unlock()
					if over || time.Now().After(deadline) {
						return
					}
					r.add(hostname(s.ns, s.dst))
				}
			}()
		}
	}
	return func() []*tally {
		end()
		wg.Wait()
		return tallies
	}
}

// The bounds of load: per worker 50 connections a second, per source
// 60,000 connections, and 6 minutes.
const (
	loadRate  = 50
	loadMax   = 60000
	loadLimit = 6 * time.Minute
)

// noFailures fails the test for each source with a failed connection and
// logs every source's count; it returns the total made.
func noFailures(t *testing.T, what string, sources []loadSource, tallies []*tally) int {
	t.Helper()
	total, failed := 0, 0
	for i, r := range tallies {
		total += r.ok() + r.fails
		failed += r.fails
		t.Logf("%s: %s to %s: %d new connections, %d failed, answers %v", what, sources[i].who, sources[i].dst, r.ok()+r.fails, r.fails, r.names)
		if r.fails != 0 {
			t.Errorf("%s: %s to %s: %d of %d new connections failed: %v", what, sources[i].who, sources[i].dst, r.fails, r.ok()+r.fails, r.errors)
		}
		if r.ok() == 0 {
			t.Errorf("%s: %s: no connection made", what, sources[i].who)
		}
	}
	t.Logf("%s: %d of %d new connections failed", what, failed, total)
	return total
}

// serviceLoadSources are the clients of a NodePort Service vip/nodePort:
// the client pod of every node to the VIP, and the outside client to the
// node port of every node.
func serviceLoadSources(t *testing.T, vip netip.AddrPort, nodePort uint16) []loadSource {
	t.Helper()
	var out []loadSource
	for _, c := range clientsOnEveryNode(t) {
		out = append(out, loadSource{who: "pod " + c.Name + " on " + c.Spec.NodeName, ns: podNS(t, c), dst: vip})
	}
	outside := lanClient(t)
	for _, n := range node.Nodes {
		out = append(out, loadSource{who: "outside client " + outside.Addr.String() + " via " + n.Name, ns: outside.Do, dst: netip.AddrPortFrom(n.IP, nodePort)})
	}
	return out
}

var (
	lanOnce sync.Once
	lanNS   *sandbox.NS
	lanErr  error
)

// lanClient is the suite's client outside the nodes (one namespace on the
// node LAN, made once; the cluster's teardown removes it).
func lanClient(t *testing.T) *sandbox.NS {
	t.Helper()
	lanOnce.Do(func() { lanNS, lanErr = node.AddLANClient() })
	if lanErr != nil {
		t.Fatal(lanErr)
	}
	return lanNS
}
