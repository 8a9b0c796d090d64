//go:build ingress

// Package ingress tests steelyard's L7 layer end to end: the agent (iptables
// mode) with --ingress runs in a sandbox node namespace against a real
// kube-apiserver and etcd, starts the real nginx (Debian's) as its child,
// and a client namespace sends HTTP(S) through nginx to pod namespaces that
// answer with their names. Root, build tag ingress; `make ingress`.
//
// IP plan: Services 198.18.0.0/16 (here 198.18.1.x), pods 198.19.3.x-198.19.9.x,
// nginx on the node's LAN address 198.19.254.1 (ports 80 and 443).
package ingress

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/ingress/harness"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

var steelyardBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	bin, cleanup, err := sandbox.AgentBinary("ingress")
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingress:", err)
		return 1
	}
	defer cleanup()
	steelyardBin = bin
	if out, err := exec.Command(harness.NginxBinary(), "-v").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "ingress: nginx is needed (scripts/install-deps.sh installs it): %v %s\n", err, out)
		return 1
	}
	stop := sandbox.CloseOnSignal()
	defer stop()
	return m.Run()
}

// newWorld starts a control plane, a sandbox and the world around them;
// everything is removed when the test ends.
func newWorld(t *testing.T) *harness.World {
	t.Helper()
	sandbox.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.WithReducedAPIs())
	sb := sandbox.NewT(t, sandbox.Options{})
	w, err := harness.New(t.Context(), cp, sb, t.Logf)
	// Runs before the sandbox's cleanup (LIFO): the agent and nginx stop
	// while the API server is still there.
	t.Cleanup(func() {
		if t.Failed() && w != nil && w.Agent != nil {
			t.Logf("agent log:\n%s", harness.Tail(w.Agent.Log(), 80))
			if conf, err := w.Conf(); err == nil {
				t.Logf("nginx.conf:\n%s", conf)
			}
		}
		if w != nil {
			w.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func startAgent(t *testing.T, w *harness.World, extra ...string) {
	t.Helper()
	start := time.Now()
	if err := w.StartAgent(steelyardBin, extra...); err != nil {
		t.Fatal(err)
	}
	t.Logf("agent and nginx serving %v after start", time.Since(start).Round(time.Millisecond))
}

func addPods(t *testing.T, w *harness.World, pods map[string]string) {
	t.Helper()
	for name, ip := range pods {
		if _, err := w.AddPod(name, ip); err != nil {
			t.Fatal(err)
		}
	}
}

// eventually polls f until it returns "" (success) or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, f func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := f()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v: %s", what, timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric reads an agent metric or fails.
func metric(t *testing.T, w *harness.World, name string) float64 {
	t.Helper()
	v, err := w.Metric(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// answer describes a response for comparisons: the pod name, or the status.
func answer(code int, body string, err error) string {
	if err != nil {
		return "error: " + harness.ErrClass(err)
	}
	if code == 200 {
		return body
	}
	return fmt.Sprint(code)
}

func ctxT(t *testing.T) context.Context { return t.Context() }

var _ = strings.TrimSpace
