//go:build node

package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The least-privilege proofs (docs/least-privilege.md): the DaemonSet of
// manifests/ runs the agent with exactly the capabilities it lists, and
// each one removed in turn (a DaemonSet rollout each) breaks a named
// feature with a clear error. These run after node_test.go (file order)
// and put the DaemonSet back as manifests/ has it.

// capNames are the Linux capabilities by bit (linux/capability.h).
var capNames = []string{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL",
	"SETGID", "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST",
	"NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT",
	"SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
	"SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE",
	"MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF",
	"CHECKPOINT_RESTORE"}

// procStatus is the kernel's view of a process: its capability sets (as
// names), NoNewPrivs and Seccomp fields.
type procStatus struct {
	eff, bnd           []string
	noNewPrivs, seccmp string
}

func readProcStatus(t *testing.T, pid int) procStatus {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var st procStatus
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "CapEff":
			st.eff = decodeCaps(t, v)
		case "CapBnd":
			st.bnd = decodeCaps(t, v)
		case "NoNewPrivs":
			st.noNewPrivs = v
		case "Seccomp":
			st.seccmp = v
		}
	}
	return st
}

func decodeCaps(t *testing.T, hex string) []string {
	t.Helper()
	mask, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		t.Fatalf("capability mask %q: %v", hex, err)
	}
	var out []string
	for bit := range 64 {
		if mask&(1<<bit) == 0 {
			continue
		}
		if bit < len(capNames) {
			out = append(out, capNames[bit])
		} else {
			out = append(out, strconv.Itoa(bit))
		}
	}
	return out
}

// agentSpec returns the agent container of a pod template.
func agentSpec(t testing.TB, tpl *corev1.PodTemplateSpec) *corev1.Container {
	t.Helper()
	for i := range tpl.Spec.Containers {
		if tpl.Spec.Containers[i].Name == "steelyard" {
			return &tpl.Spec.Containers[i]
		}
	}
	t.Fatal("DaemonSet has no steelyard container")
	return nil
}

// The running agent, as the kernel sees it, has exactly the DaemonSet's
// capabilities, no_new_privs and a seccomp filter; its root is read-only,
// /proc/sys is read-only but the node's net sysctls are writable through
// the hostPath mount; install-cni has no service account token.
func TestPrivilegesFinalSet(t *testing.T) {
	p := steelyardPod(t)
	for _, c := range p.Spec.InitContainers {
		for _, m := range c.VolumeMounts {
			if strings.Contains(m.MountPath, "serviceaccount") {
				t.Errorf("init container %s mounts %s", c.Name, m.MountPath)
			}
		}
	}
	if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
		t.Errorf("pod automountServiceAccountToken %v, want false", p.Spec.AutomountServiceAccountToken)
	}
	pid, err := node.TaskPid(t.Context(), p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	st := readProcStatus(t, pid)
	t.Logf("agent pid %d: CapEff %v, CapBnd %v, NoNewPrivs %s, Seccomp %s (2 = filter)", pid, st.eff, st.bnd, st.noNewPrivs, st.seccmp)
	want := []string{"NET_ADMIN", "NET_RAW"}
	if !slices.Equal(st.eff, want) || !slices.Equal(st.bnd, want) {
		t.Errorf("agent capabilities: effective %v, bounding %v, want %v", st.eff, st.bnd, want)
	}
	if st.noNewPrivs != "1" || st.seccmp != "2" {
		t.Errorf("agent NoNewPrivs %s Seccomp %s, want 1 and 2", st.noNewPrivs, st.seccmp)
	}
	checks := []struct {
		what, cmd string
		ok        bool
		want      string
	}{
		{"root filesystem", "touch /usr/local/bin/x", false, "Read-only file system"},
		{"container /proc/sys", "echo 1 > /proc/sys/net/ipv4/ip_forward", false, "Read-only file system"},
		{"host /proc/sys/net", "cat /host/proc/sys/net/ipv4/ip_forward > /host/proc/sys/net/ipv4/ip_forward && cat /host/proc/sys/net/ipv4/ip_forward", true, "1"},
		{"token", "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo present", true, "present"},
		{"nginx dir", "mkdir -p /run/steelyard/x && rmdir /run/steelyard/x && echo writable", true, "writable"},
	}
	for _, c := range checks {
		out, err := inSteelyard(t, "sh", "-c", c.cmd)
		if (err == nil) != c.ok || !strings.Contains(out+fmt.Sprint(err), c.want) {
			t.Errorf("%s: `%s`: %q, %v; want ok=%v and %q", c.what, c.cmd, out, err, c.ok, c.want)
			continue
		}
		t.Logf("%s: `%s` -> %s", c.what, c.cmd, strings.TrimSpace(lastLineWith(out+fmt.Sprint(err), c.want)))
	}
	waitVerify(t, 30*time.Second)
}

// rollout replaces the DaemonSet's pod template with mutate's edit of
// manifests/' template and returns the new pod (created after the
// update), without waiting for it to be Ready.
func rollout(t *testing.T, base *corev1.PodTemplateSpec, mutate func(*corev1.PodTemplateSpec)) corev1.Pod {
	t.Helper()
	ctx := t.Context()
	dsc := node.Client().AppsV1().DaemonSets("steelyard")
	old := map[string]bool{}
	pods, err := node.Client().CoreV1().Pods("steelyard").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=steelyard"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		old[p.Name] = true
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dsc.Get(ctx, "steelyard", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ds.Spec.Template = *base.DeepCopy()
		if mutate != nil {
			mutate(&ds.Spec.Template)
		}
		_, err = dsc.Update(ctx, ds, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		pods, err := node.Client().CoreV1().Pods("steelyard").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=steelyard"})
		if err == nil {
			for _, p := range pods.Items {
				if !old[p.Name] && p.DeletionTimestamp == nil && len(p.Status.ContainerStatuses) > 0 {
					return p
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no new steelyard pod 90 s after the DaemonSet update")
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// waitLog waits until the agent container of pod (this run or the
// previous one, after a crash) logged a line with every one of subs, and
// returns that line.
func waitLog(t *testing.T, pod string, timeout time.Duration, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, prev := range []string{"--previous=false", "--previous=true"} {
			out, _ := node.Kubectl(t.Context(), "-n", "steelyard", "logs", pod, "-c", "steelyard", prev)
			for _, l := range strings.Split(out, "\n") {
				all := true
				for _, s := range subs {
					all = all && strings.Contains(l, s)
				}
				if all {
					return strings.TrimSpace(l)
				}
			}
		}
		if time.Now().After(deadline) {
			out, _ := node.Kubectl(t.Context(), "-n", "steelyard", "logs", pod, "-c", "steelyard", "--tail=15")
			t.Fatalf("pod %s logged no line with %q in %v; last lines:\n%s", pod, subs, timeout, out)
		}
		time.Sleep(time.Second)
	}
}

// podReady reports whether the pod is Ready now.
func podReady(t *testing.T, name string) bool {
	t.Helper()
	p, err := node.Client().CoreV1().Pods("steelyard").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func dropCap(c *corev1.Container, name corev1.Capability) {
	c.SecurityContext.Capabilities.Add = slices.DeleteFunc(slices.Clone(c.SecurityContext.Capabilities.Add), func(x corev1.Capability) bool { return x == name })
}

func setArg(c *corev1.Container, prefix, arg string) {
	for i, a := range c.Args {
		if strings.HasPrefix(a, prefix) {
			if arg == "" {
				c.Args = slices.Delete(c.Args, i, i+1)
			} else {
				c.Args[i] = arg
			}
			return
		}
	}
	if arg != "" {
		c.Args = append(c.Args, arg)
	}
}

// baseTemplate returns the DaemonSet's template as manifests/ made it and
// puts it back (and waits for the agent to verify) when t ends.
func baseTemplate(t *testing.T) *corev1.PodTemplateSpec {
	t.Helper()
	ds, err := node.Client().AppsV1().DaemonSets("steelyard").Get(t.Context(), "steelyard", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := ds.Spec.Template.DeepCopy()
	t.Cleanup(func() { restoreDaemonSet(t, base) })
	return base
}

func restoreDaemonSet(t *testing.T, base *corev1.PodTemplateSpec) {
	ctx := context.Background()
	dsc := node.Client().AppsV1().DaemonSets("steelyard")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds, err := dsc.Get(ctx, "steelyard", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ds.Spec.Template = *base.DeepCopy()
		_, err = dsc.Update(ctx, ds, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("restore DaemonSet: %v", err)
		return
	}
	if _, err := node.Kubectl(ctx, "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m"); err != nil {
		t.Errorf("restore DaemonSet: %v", err)
	}
}

// Each capability (and the sysctl mount) of the final set removed in
// turn: the agent says what it cannot do, never becomes Ready, and the
// feature it serves breaks. NET_RAW is needed by iptables legacy only: on
// this node (nft) it can go.
func TestPrivilegesEachRemoved(t *testing.T) {
	web(t)
	base := baseTemplate(t)
	type removal struct {
		id, name string
		mutate   func(*corev1.PodTemplateSpec)
		before   func(t *testing.T)
		works    bool     // the agent still serves (verify passes)
		mode     string   // --mode of the agent and verify; "" is the manifests' iptables
		logSubs  []string // the error the agent logs
		breaks   string
	}
	cases := []removal{
		{
			id: "NET_ADMIN", name: "NET_ADMIN",
			mutate:  func(tpl *corev1.PodTemplateSpec) { dropCap(agentSpec(t, tpl), "NET_ADMIN") },
			logSubs: []string{"sync failed", "IPv4", "Permission denied"},
			breaks:  "every netfilter read and write: no rules, pod never Ready",
		},
		{
			id: "NET_RAW-legacy", name: "NET_RAW with --iptables-mode legacy",
			mutate: func(tpl *corev1.PodTemplateSpec) {
				c := agentSpec(t, tpl)
				dropCap(c, "NET_RAW")
				setArg(c, "--iptables-mode=", "--iptables-mode=legacy")
			},
			logSubs: []string{"sync failed", "iptables-legacy", "Permission denied"},
			breaks:  "iptables legacy: every sync fails, pod never Ready",
		},
		{
			id: "NET_RAW-nft", name: "NET_RAW removed, iptables nft (this node's flavour)",
			mutate: func(tpl *corev1.PodTemplateSpec) { dropCap(agentSpec(t, tpl), "NET_RAW") },
			works:  true,
		},
		{
			id: "nftables", name: "--mode nftables with the final set", mode: "nftables", works: true,
			mutate: func(tpl *corev1.PodTemplateSpec) { setArg(agentSpec(t, tpl), "--mode=", "--mode=nftables") },
		},
		{
			id: "NET_ADMIN-nftables", name: "NET_ADMIN with --mode nftables", mode: "nftables",
			mutate: func(tpl *corev1.PodTemplateSpec) {
				c := agentSpec(t, tpl)
				dropCap(c, "NET_ADMIN")
				setArg(c, "--mode=", "--mode=nftables")
			},
			logSubs: []string{"nftables", "Operation not permitted"},
			breaks:  "nftables: the agent exits at start (CrashLoopBackOff)",
		},
		{
			id: "proc-sys-net", name: "the host /proc/sys/net mount (ip_forward 0)",
			mutate: func(tpl *corev1.PodTemplateSpec) {
				c := agentSpec(t, tpl)
				setArg(c, "--sysctl-dir=", "")
				c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "proc-sys-net" })
			},
			before: func(t *testing.T) {
				if err := node.Sandbox.Node.WriteSysctl("net/ipv4/ip_forward", "0"); err != nil {
					t.Fatal(err)
				}
			},
			logSubs: []string{"ip_forward", "read-only file system"},
			breaks:  "net.ipv4.ip_forward: the agent refuses to start (CrashLoopBackOff)",
		},
	}
	var table []string
	for _, c := range cases {
		t.Run(c.id, func(t *testing.T) {
			t0 := time.Now()
			if c.before != nil {
				c.before(t)
			}
			p := rollout(t, base, c.mutate)
			if c.works {
				if _, err := node.Kubectl(t.Context(), "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m"); err != nil {
					t.Fatal(err)
				}
				verifyMode(t, c.mode, 30*time.Second)
				table = append(table, fmt.Sprintf("%s: works (verify passes) [%v]", c.name, time.Since(t0).Round(time.Second)))
				return
			}
			line := waitLog(t, p.Name, 60*time.Second, c.logSubs...)
			// Readiness is the first successful sync: it never comes.
			for range 10 {
				if podReady(t, p.Name) {
					t.Fatalf("pod %s without %s is Ready", p.Name, c.name)
				}
				time.Sleep(time.Second)
			}
			table = append(table, fmt.Sprintf("%s removed: %s; pod %s not Ready; log: %s [%v]", c.name, c.breaks, p.Name, line, time.Since(t0).Round(time.Second)))
		})
	}
	// Back to the final set: the agent turns ip_forward on again through
	// the hostPath mount.
	t0 := time.Now()
	restoreDaemonSet(t, base)
	// The nftables agent's table stays (rules survive restarts): remove it.
	if out, err := inSteelyard(t, "steelyard", "cleanup", "--mode=nftables"); err != nil {
		t.Errorf("cleanup --mode nftables: %v\n%s", err, out)
	}
	waitVerify(t, 30*time.Second)
	v, err := node.Sandbox.Node.ReadSysctl("net/ipv4/ip_forward")
	if err != nil || v != "1" {
		t.Errorf("after the final set came back: node ip_forward %q, %v; want 1 (written by the agent through /host/proc/sys)", v, err)
	}
	table = append(table, fmt.Sprintf("final set back: Ready, verify passes, node ip_forward %s written by the agent [%v]", v, time.Since(t0).Round(time.Second)))
	for _, l := range table {
		t.Log(l)
	}
}

// ingressCaps are what --ingress adds for nginx (docs/least-privilege.md).
var ingressCaps = []corev1.Capability{"NET_BIND_SERVICE", "SETUID", "SETGID", "CHOWN", "KILL"}

// --ingress with the capabilities nginx needs: an Ingress to web answers
// on the node's port 80 from outside, and after nginx's master is killed
// the agent ends its workers and starts a new nginx; each capability
// removed in turn breaks nginx with its own error.
func TestPrivilegesIngress(t *testing.T) {
	web(t)
	base := baseTemplate(t)
	kubectl(t, "apply", "-f", filepath.Join(manifestsDir(), "ingress"))
	t.Cleanup(func() {
		_, _ = node.Kubectl(context.Background(), "delete", "--ignore-not-found", "-f", filepath.Join(manifestsDir(), "ingress"))
	})
	apply(t, `apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default}
spec:
  ingressClassName: steelyard
  rules:
  - http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
`)
	outside, err := node.Sandbox.AddClient(netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://%s/hostname", node.NodeIP)
	withIngress := func(drop corev1.Capability) func(*corev1.PodTemplateSpec) {
		return func(tpl *corev1.PodTemplateSpec) {
			c := agentSpec(t, tpl)
			setArg(c, "--ingress", "--ingress")
			for _, k := range ingressCaps {
				if k != drop {
					c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, k)
				}
			}
		}
	}
	get := func() (int, string, error) { return outside.HTTPGet(url, 3*time.Second) }

	t0 := time.Now()
	rollout(t, base, withIngress(""))
	if _, err := node.Kubectl(t.Context(), "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	var code int
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err = get()
		if err == nil && code == 200 && strings.HasPrefix(body, "web-") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s through nginx with %v: %d %q %v", url, ingressCaps, code, body, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	p := steelyardPod(t)
	pid, err := node.TaskPid(t.Context(), p.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	st := readProcStatus(t, pid)
	table := []string{fmt.Sprintf("--ingress with %v: GET %s -> %d %s; agent CapEff %v [%v]", ingressCaps, url, code, body, st.eff, time.Since(t0).Round(time.Second))}
	table = append(table, "nginx master SIGKILLed: "+crashNginx(t, p.Name, get, true))

	// What nginx says without each one (the agent relays nginx's stderr).
	want := map[corev1.Capability][]string{
		"NET_BIND_SERVICE": {"bind() to 0.0.0.0:80 failed (13: Permission denied)"},
		"SETUID":           {"setuid(65534) failed (1: Operation not permitted)"},
		"SETGID":           {"setgid(65534) failed (1: Operation not permitted)"},
		"CHOWN":            {"chown(", "failed (1: Operation not permitted)"},
	}
	for _, k := range ingressCaps {
		t.Run(string(k), func(t *testing.T) {
			t0 := time.Now()
			p := rollout(t, base, withIngress(k))
			if k == "KILL" {
				// nginx runs; what breaks is its recovery from a crash.
				if _, err := node.Kubectl(t.Context(), "-n", "steelyard", "rollout", "status", "ds/steelyard", "--timeout=2m"); err != nil {
					t.Fatal(err)
				}
				table = append(table, fmt.Sprintf("--ingress without KILL, nginx master SIGKILLed: %s [%v]", crashNginx(t, p.Name, get, false), time.Since(t0).Round(time.Second)))
				return
			}
			line := waitLog(t, p.Name, 60*time.Second, want[k]...)
			code, body, err := get()
			if err == nil && code == 200 {
				t.Errorf("without %s: GET %s still answers %d %q", k, url, code, body)
			}
			table = append(table, fmt.Sprintf("--ingress without %s: GET -> %d %v; log: %s [%v]", k, code, err, line, time.Since(t0).Round(time.Second)))
		})
	}
	for _, l := range table {
		t.Log(l)
	}
}

// crashNginx SIGKILLs nginx's master in the agent's pod (as a crash
// would). Its workers (user nobody) keep port 80; the agent kills their
// process group and starts nginx again, which takes CAP_KILL (root signals
// another user's processes). recovers says which outcome to expect: a new
// master that serves, or the new master failing to bind port 80.
func crashNginx(t *testing.T, pod string, get func() (int, string, error), recovers bool) string {
	t.Helper()
	pidOf := func() string {
		out, _ := node.Kubectl(t.Context(), "-n", "steelyard", "exec", pod, "-c", "steelyard", "--", "cat", "/run/steelyard/nginx/nginx.pid")
		return strings.TrimSpace(out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if code, _, err := get(); err == nil && code == 200 && pidOf() != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("nginx does not serve before the crash")
		}
		time.Sleep(500 * time.Millisecond)
	}
	before := pidOf()
	if out, err := node.Kubectl(t.Context(), "-n", "steelyard", "exec", pod, "-c", "steelyard", "--", "sh", "-c", "kill -9 "+before); err != nil {
		t.Fatalf("kill -9 nginx master %s: %v %s", before, err, out)
	}
	if !recovers {
		line := waitLog(t, pod, 30*time.Second, "bind() to 0.0.0.0:80 failed (98: Address already in use)")
		return "old workers keep port 80 (agent cannot kill them), every new nginx fails: " + line
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		after := pidOf()
		code, body, err := get()
		if after != "" && after != before && err == nil && code == 200 {
			out, _ := node.Kubectl(t.Context(), "-n", "steelyard", "logs", pod, "-c", "steelyard")
			if strings.Contains(out, "Address already in use") {
				t.Errorf("nginx restarted but one start failed to bind:\n%s", lastLineWith(out, "Address already in use"))
			}
			return fmt.Sprintf("master %s -> %s, GET -> %d %s", before, after, code, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx not back 30 s after its master %s was killed: pid %q, GET %d %v", before, after, code, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// verifyMode is waitVerify for an agent of another --mode ("" is the
// manifests' iptables).
func verifyMode(t *testing.T, mode string, timeout time.Duration) {
	t.Helper()
	if mode == "" {
		waitVerify(t, timeout)
		return
	}
	deadline := time.Now().Add(timeout)
	for {
		out, err := inSteelyard(t, "steelyard", "verify", "--mode="+mode)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("steelyard verify --mode=%s after %v: %v\n%s", mode, timeout, err, out)
		}
		time.Sleep(time.Second)
	}
}
