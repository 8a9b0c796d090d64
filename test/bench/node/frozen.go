package main

// The "frozen" phase (issue 21 item 5): the churn of "churn" with
// steelyard's rule writing stopped, so that the tail it leaves is the
// node's (pod creation and teardown on 2 cores) and the difference to
// "churn" is steelyard's.
//
// How the rules are frozen, and why this way: nginx runs inside the
// steelyard container (--ingress starts it as the agent's child), so
// stopping the DaemonSet's pod would stop the load's path too; a flag of
// `steelyard run` that stops syncing would be test-only code in the
// product. Instead the harness stops the agent's process with SIGSTOP
// (from the host, by the container's PID as containerd reports it) and
// continues it with SIGCONT after the run: nothing of steelyard runs, so
// no rule can change (a sync the stop interrupts commits all or nothing:
// one restore or netlink batch), while nginx (its own processes) keeps
// serving and the kernel keeps the last rules the agent wrote. It needs:
//   - no liveness probe while the agent is stopped (kubelet would restart
//     the container, and nginx with it): with the frozen phase requested,
//     node-bench removes the probe once before any run, so every phase of
//     the report runs under the same condition (Report.NoLivenessProbe);
//   - the pods in the frozen rules stay alive: the 5 backends present at
//     the freeze get a high controller.kubernetes.io/pod-deletion-cost, so
//     each scale-down deletes the 2 pods created since (never in the
//     rules, so they get no traffic), which is also what the ReplicaSet
//     controller picks in "churn" (the newest Ready pods first);
//     Run.FrozenKept says how many were still there at the end.
// A limit: nginx's error log goes through a pipe the agent reads; a
// stopped agent leaves 64 KiB of it before nginx would block on a write.
// With the rules pointing at live pods nginx logs next to nothing; its
// upstream errors are read after the thaw (Run.NginxErrors), and a blocked
// nginx would show as timeouts in the run's errors.

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// phaseNames are the runs node-bench knows, in the order the help lists.
var phaseNames = []string{"steady", "churn", "bystander", "frozen"}

// parsePhases splits -phases and rejects unknown or repeated names.
func parsePhases(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(phaseNames, p) {
			return nil, fmt.Errorf("unknown phase %q (%s)", p, strings.Join(phaseNames, ", "))
		}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("phase %q twice", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// churns is whether a phase scales a Deployment 5 <-> 7.
func churns(phase string) bool { return phase != "steady" }

// deletionCost is the annotation that orders a ReplicaSet's scale-down
// (lower cost goes first), and keptCost the cost of the frozen backends.
const (
	deletionCost = "controller.kubernetes.io/pod-deletion-cost"
	keptCost     = "1000"
)

// dropLivenessProbe rolls the DaemonSet without its liveness probe (a
// stopped agent must not be restarted), and waits for the new pod.
func dropLivenessProbe(ctx context.Context, c *cluster.Cluster) error {
	log.Printf("rolling the DaemonSet without its liveness probe (the frozen phase stops the agent)")
	if _, err := c.Kubectl(ctx, "-n", "steelyard", "patch", "ds", "steelyard", "--type=json",
		"-p", `[{"op":"remove","path":"/spec/template/spec/containers/0/livenessProbe"}]`); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=3m")
	return err
}

// frozenPID is the stopped agent's PID (0: none), for the signal handler:
// an interrupted benchmark continues it before tearing the node down.
var frozenPID atomic.Int64

// thawOnExit continues a stopped agent, if any.
func thawOnExit() {
	if pid := frozenPID.Swap(0); pid > 0 {
		_ = syscall.Kill(int(pid), syscall.SIGCONT)
	}
}

// freezer is one frozen phase: the stopped agent and the backends kept.
type freezer struct {
	b        *bench
	pid      int
	restarts int32        // the container's restart count at the freeze
	m0       agentMetrics // the agent's metrics just before the freeze
	kept     []string     // the backends in the frozen rules
}

// freeze protects the bench pods present now, waits until the agent has
// had no sync for a second (its rules are those of these pods), then stops
// it. The caller must call thaw, also on error.
func (b *bench) freeze(ctx context.Context) (*freezer, error) {
	f := &freezer{b: b}
	pods, err := b.c.Client().CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=bench"})
	if err != nil {
		return f, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if err := b.setDeletionCost(ctx, p.Name, keptCost); err != nil {
			return f, err
		}
		f.kept = append(f.kept, p.Name)
	}
	// The rules to freeze are those of these pods: the EndpointSlices
	// list exactly them as ready, and the agent has synced since.
	if err := b.slicesHold(ctx, f.kept); err != nil {
		return f, err
	}
	if err := b.quiet(ctx); err != nil {
		return f, err
	}
	if f.m0, err = b.metricsNow(); err != nil {
		return f, err
	}
	agent, err := b.agentPod(ctx)
	if err != nil {
		return f, err
	}
	st := agentStatus(agent)
	f.restarts = st.RestartCount
	pid, err := b.c.TaskPid(ctx, st.ContainerID)
	if err != nil {
		return f, err
	}
	// The container's main process is the agent (nginx runs as its child
	// with its own PIDs); check before signalling anything.
	if cmd, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline"); err != nil || !strings.Contains(string(cmd), "steelyard") {
		return f, fmt.Errorf("PID %d is not the steelyard agent (%q, %v)", pid, cmd, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return f, fmt.Errorf("stop the agent: %w", err)
	}
	f.pid = pid
	frozenPID.Store(int64(pid))
	if err := f.check(ctx); err != nil {
		return f, err
	}
	log.Printf("frozen: agent PID %d stopped, %d backends kept: %s", pid, len(f.kept), strings.Join(f.kept, " "))
	return f, nil
}

// slicesHold waits until the bench Service's EndpointSlices list exactly
// the pods named as ready endpoints.
func (b *bench) slicesHold(ctx context.Context, pods []string) error {
	deadline := time.Now().Add(30 * time.Second)
	var ready []string
	for {
		list, err := b.c.Client().DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=bench"})
		if err == nil {
			ready = ready[:0]
			for _, sl := range list.Items {
				for _, ep := range sl.Endpoints {
					if ep.TargetRef != nil && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						ready = append(ready, ep.TargetRef.Name)
					}
				}
			}
			slices.Sort(ready)
			if slices.Equal(ready, slices.Sorted(slices.Values(pods))) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the bench EndpointSlices list %v as ready, not %v, after 30 s (%v)", ready, pods, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// quiet waits until the agent's last-sync time has not moved for a second.
func (b *bench) quiet(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	prev, err := b.metricsNow()
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		m, err2 := b.metricsNow()
		if err == nil && err2 == nil && m.lastSync == prev.lastSync {
			return nil
		}
		prev, err = m, err2
	}
	return fmt.Errorf("the agent did not stop syncing for a second in 30 s (last error: %v)", err)
}

// check fails unless the agent is still the same stopped process (a
// second after a SIGSTOP at most: the signal is delivered asynchronously).
func (f *freezer) check(ctx context.Context) error {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(50 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(f.pid) + "/stat")
		if err != nil {
			return fmt.Errorf("agent PID %d: %w", f.pid, err)
		}
		if stopped(string(stat)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent PID %d is not stopped: %.60s", f.pid, stat)
		}
	}
	agent, err := f.b.agentPod(ctx)
	if err != nil {
		return err
	}
	if n := agentStatus(agent).RestartCount; n != f.restarts {
		return fmt.Errorf("the steelyard container restarted while frozen (%d -> %d)", f.restarts, n)
	}
	return nil
}

// stopped is whether a /proc/PID/stat line ("pid (comm) state ...", comm
// may hold spaces and parentheses) says the process is stopped by a signal.
func stopped(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) >= i+3 && stat[i+2] == 'T'
}

// thaw continues the agent and removes the backends' deletion cost.
func (f *freezer) thaw(ctx context.Context) error {
	var errs []string
	if f.pid > 0 {
		if err := syscall.Kill(f.pid, syscall.SIGCONT); err != nil {
			errs = append(errs, fmt.Sprintf("continue the agent: %v", err))
		} else {
			log.Printf("thawed: agent PID %d continued", f.pid)
		}
		f.pid = 0
		frozenPID.Store(0)
	}
	for _, name := range f.kept {
		if err := f.b.setDeletionCost(ctx, name, ""); err != nil && !strings.Contains(err.Error(), "not found") {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("thaw: %s", strings.Join(errs, "; "))
	}
	return nil
}

// alive counts the kept backends that exist and are not being deleted.
func (f *freezer) alive(ctx context.Context) (int, error) {
	pods, err := f.b.c.Client().CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=bench"})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && slices.Contains(f.kept, p.Name) {
			n++
		}
	}
	return n, nil
}

// setDeletionCost sets the pod's deletion cost, or removes it ("").
func (b *bench) setDeletionCost(ctx context.Context, pod, cost string) error {
	var v any // null removes the annotation in a merge patch
	if cost != "" {
		v = cost
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{deletionCost: v}}})
	_, err := b.c.Client().CoreV1().Pods("default").Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// agentPod is the steelyard DaemonSet's one running pod.
func (b *bench) agentPod(ctx context.Context) (*corev1.Pod, error) {
	list, err := b.c.Client().CoreV1().Pods("steelyard").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=steelyard"})
	if err != nil {
		return nil, err
	}
	var found []*corev1.Pod
	for i, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && agentStatus(&p).ContainerID != "" {
			found = append(found, &list.Items[i])
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("want one running steelyard pod, found %d", len(found))
	}
	return found[0], nil
}

// agentStatus is the status of the pod's steelyard container (empty
// before it started).
func agentStatus(p *corev1.Pod) corev1.ContainerStatus {
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "steelyard" {
			return c
		}
	}
	return corev1.ContainerStatus{}
}
