package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir     = "../../charts/steelyard"
	manifestsDir = "../../manifests"
)

func load(t *testing.T) map[string][]byte {
	t.Helper()
	c, err := Load(chartDir, "")
	if err != nil {
		t.Fatal(err)
	}
	tree, err := Manifests(c)
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// render renders the chart with vals and returns the files by template.
func render(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	c, err := Load(chartDir, "")
	if err != nil {
		t.Fatal(err)
	}
	files, err := Render(c, vals)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// docs splits a rendered file into its YAML documents (comments and empty
// documents dropped by the decoder of each caller).
func docs(text string) []string {
	var out []string
	for _, d := range strings.Split("\n"+text, "\n---\n") {
		if strings.TrimSpace(d) != "" {
			out = append(out, d)
		}
	}
	return out
}

func daemonSet(t *testing.T, files map[string]string) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(files["30-daemonset.yaml"]), &ds); err != nil {
		t.Fatalf("30-daemonset.yaml: %v", err)
	}
	return &ds
}

// configMaps returns the ConfigMaps of 20-config.yaml by name.
func configMaps(t *testing.T, files map[string]string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	for _, d := range docs(files["20-config.yaml"]) {
		var cm corev1.ConfigMap
		if err := yaml.UnmarshalStrict([]byte(d), &cm); err != nil {
			t.Fatalf("20-config.yaml: %v", err)
		}
		out[cm.Name] = cm.Data
	}
	return out
}

// TestManifestsAreTheRender is what make chart-check enforces: the
// committed manifests/ is the chart's render with its default values.
func TestManifestsAreTheRender(t *testing.T) {
	diffs, err := Diff(load(t), manifestsDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Errorf("manifests/%s (run make manifests)", d)
	}
}

// TestDiffFindsHandEdits: a changed, a removed and an extra file under
// manifests/ are each reported; the hand-kept conflist is not.
func TestDiffFindsHandEdits(t *testing.T) {
	tree := load(t)
	dir := t.TempDir()
	if err := writeTree(dir, tree); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cni"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rel, text string) {
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cni/10-steelyard.conflist", "{}")
	if d, err := Diff(tree, dir); err != nil || len(d) != 0 {
		t.Fatalf("a fresh render differs: %v %v", d, err)
	}
	cfg := strings.Replace(string(tree["20-config.yaml"]), `MODE: "iptables"`, `MODE: "nftables"`, 1)
	write("20-config.yaml", cfg)
	write("40-extra.yaml", "kind: ConfigMap\n")
	if err := os.Remove(filepath.Join(dir, "gateway", "20-gatewayclass.yaml")); err != nil {
		t.Fatal(err)
	}
	d, err := Diff(tree, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"20-config.yaml: differs from the chart's render",
		"gateway/20-gatewayclass.yaml: missing (the chart renders it)",
		"40-extra.yaml: not rendered by the chart",
	}
	slices.Sort(d)
	slices.Sort(want)
	if !slices.Equal(d, want) {
		t.Errorf("Diff = %q, want %q", d, want)
	}
}

// TestIngressPatch: the generated manifests/ingress/patch/ingress-on.json
// applied to the default DaemonSet (by an RFC 6902 implementation, not
// ours) gives the DaemonSet of ingress.enabled=true.
func TestIngressPatch(t *testing.T) {
	tree := load(t)
	patch, err := jsonpatch.DecodePatch(tree[ingressPatch])
	if err != nil {
		t.Fatal(err)
	}
	off, err := yaml.YAMLToJSON([]byte(render(t, nil)["30-daemonset.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(off)
	if err != nil {
		t.Fatal(err)
	}
	on, err := yaml.YAMLToJSON([]byte(render(t, map[string]any{"ingress": map[string]any{"enabled": true}})["30-daemonset.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if !jsonpatch.Equal(patched, on) {
		t.Errorf("default DaemonSet + %s:\n%s\nwant ingress.enabled=true's:\n%s", ingressPatch, patched, on)
	}
	args := daemonSet(t, render(t, map[string]any{"ingress": map[string]any{"enabled": true}})).Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--ingress") || !slices.Contains(args, "--ingress-configmap=steelyard/steelyard-ingress-nginx") {
		t.Errorf("ingress.enabled=true: args %q lack --ingress and its ConfigMap", args)
	}
}

// TestValues: each value reaches the object and field it names.
func TestValues(t *testing.T) {
	files := render(t, map[string]any{
		"mode":             "nftables",
		"iptablesMode":     "legacy",
		"apiServer":        "198.19.0.1:6443",
		"clusterCIDR":      "198.19.64.0/18",
		"detectLocalMode":  "NodeCIDR",
		"image":            map[string]any{"repository": "example.test/steelyard", "tag": "v9.9.9", "pullPolicy": "Always"},
		"resources":        map[string]any{"limits": map[string]any{"memory": "512Mi"}},
		"tolerations":      []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "lb", "effect": "NoSchedule"}},
		"nodeSelector":     map[string]any{"kubernetes.io/os": "linux"},
		"metrics":          map[string]any{"enabled": false},
		"countConnections": true,
		"gateway":          map[string]any{"enabled": true, "addressPool": "198.18.255.0/24"},
		"extraArgs":        []any{"--localhost-nodeports=false"},
	})
	cms := configMaps(t, files)
	for k, want := range map[string]string{"MODE": "nftables", "IPTABLES_MODE": "legacy", "CLUSTER_CIDR": "198.19.64.0/18", "DETECT_LOCAL_MODE": "NodeCIDR"} {
		if got := cms["steelyard-config"][k]; got != want {
			t.Errorf("steelyard-config %s = %q, want %q", k, got, want)
		}
	}
	if got := cms["steelyard-apiserver"]; got["KUBERNETES_SERVICE_HOST"] != "198.19.0.1" || got["KUBERNETES_SERVICE_PORT"] != "6443" {
		t.Errorf("steelyard-apiserver = %v", got)
	}
	spec := daemonSet(t, files).Spec.Template.Spec
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Image != "example.test/steelyard:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("container %s: image %s %s", c.Name, c.Image, c.ImagePullPolicy)
		}
	}
	agent := spec.Containers[0]
	// Helm merges maps: the default requests stay beside the new limit.
	if got := agent.Resources.Limits.Memory().String(); got != "512Mi" || agent.Resources.Requests.Cpu().String() != "50m" {
		t.Errorf("resources = %v, want limits.memory 512Mi and the default requests", agent.Resources)
	}
	if len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "dedicated" {
		t.Errorf("tolerations = %v", spec.Tolerations)
	}
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector = %v", spec.NodeSelector)
	}
	for _, want := range []string{"--metrics-bind-address=", "--count-connections", "--gateway", "--gateway-address-pool=198.18.255.0/24", "--localhost-nodeports=false"} {
		if !slices.Contains(agent.Args, want) {
			t.Errorf("args %q lack %q", agent.Args, want)
		}
	}
	for _, p := range agent.Ports {
		if p.Name == "metrics" {
			t.Errorf("metrics.enabled=false still declares port %v", p)
		}
	}
	if files["gateway/10-rbac.yaml"] == "" || files["gateway/20-gatewayclass.yaml"] == "" {
		t.Error("gateway.enabled=true renders no gateway RBAC or GatewayClass")
	}
	if _, ok := files["ingress/10-rbac.yaml"]; ok {
		t.Error("ingress RBAC rendered with ingress.enabled=false")
	}

	// IPv6 in brackets; beside kube-proxy no apiserver ConfigMap at all.
	if got := configMaps(t, render(t, map[string]any{"apiServer": "[2001:2::1]:443"}))["steelyard-apiserver"]; got["KUBERNETES_SERVICE_HOST"] != "2001:2::1" || got["KUBERNETES_SERVICE_PORT"] != "443" {
		t.Errorf("[2001:2::1]:443: steelyard-apiserver = %v", got)
	}
	if strings.Contains(render(t, nil)["30-daemonset.yaml"], "--count-connections") {
		t.Error("--count-connections rendered with countConnections at its default (false)")
	}
	if _, ok := configMaps(t, render(t, nil))["steelyard-apiserver"]; ok {
		t.Error("apiServer empty: steelyard-apiserver rendered")
	}
	// No CNI install: no init container and no hostPath for it.
	spec = daemonSet(t, render(t, map[string]any{"cni": map[string]any{"install": false}})).Spec.Template.Spec
	if len(spec.InitContainers) != 0 || slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return strings.HasPrefix(v.Name, "cni-") }) {
		t.Errorf("cni.install=false: init containers %d, volumes %v", len(spec.InitContainers), spec.Volumes)
	}
}

// TestEBPFMode: mode ebpf gets the cgroup and bpffs hostPaths, the flags
// that point at them and CAP_BPF; the other modes get none of them
// (helm template has no live ConfigMap, so no upgrade away from ebpf).
func TestEBPFMode(t *testing.T) {
	spec := daemonSet(t, render(t, map[string]any{"mode": "ebpf", "ebpf": map[string]any{"cgroupPath": "/sys/fs/cgroup/unified/n1"}})).Spec.Template.Spec
	agent := spec.Containers[0]
	for _, want := range []string{"--cgroup-path=/host/cgroup", "--bpf-pin-dir=/sys/fs/bpf/steelyard"} {
		if !slices.Contains(agent.Args, want) {
			t.Errorf("mode ebpf: args %q lack %q", agent.Args, want)
		}
	}
	if !slices.Contains(agent.SecurityContext.Capabilities.Add, "BPF") {
		t.Errorf("mode ebpf: capabilities %v lack BPF", agent.SecurityContext.Capabilities.Add)
	}
	host := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			host[v.Name] = v.HostPath.Path
		}
	}
	if host["bpffs"] != "/sys/fs/bpf" || host["cgroup"] != "/sys/fs/cgroup/unified/n1" {
		t.Errorf("mode ebpf: hostPaths %v, want bpffs /sys/fs/bpf and cgroup /sys/fs/cgroup/unified/n1", host)
	}
	for _, m := range agent.VolumeMounts {
		if m.Name == "bpffs" && (m.MountPath != "/sys/fs/bpf" || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
			t.Errorf("bpffs mount %+v, want /sys/fs/bpf with HostToContainer", m)
		}
	}
	spec = daemonSet(t, render(t, map[string]any{"mode": "nftables"})).Spec.Template.Spec
	if slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == "bpffs" || v.Name == "cgroup" }) ||
		slices.Contains(spec.Containers[0].SecurityContext.Capabilities.Add, "BPF") {
		t.Errorf("mode nftables: ebpf mounts or CAP_BPF: volumes %v, capabilities %v", spec.Volumes, spec.Containers[0].SecurityContext.Capabilities.Add)
	}
}

// TestConfigChangeRollsPods: helm upgrade --set mode=nftables changes only
// the ConfigMap's data, so the pod template carries the config's hash and
// the DaemonSet rolls.
func TestConfigChangeRollsPods(t *testing.T) {
	hash := func(vals map[string]any) string {
		return daemonSet(t, render(t, vals)).Spec.Template.Annotations["steelyard.io/config-hash"]
	}
	a, b, c := hash(nil), hash(map[string]any{"mode": "nftables"}), hash(map[string]any{"apiServer": "198.19.0.1:6443"})
	if a == "" || a == b || a == c || b == c {
		t.Errorf("config hashes: default %q, mode=nftables %q, apiServer set %q: want three different", a, b, c)
	}
}

// TestBadValues: the schema and the templates reject what the agent would
// reject later, with the value's name in the message.
func TestBadValues(t *testing.T) {
	c, err := Load(chartDir, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"mode": "userspace"}, "mode"},
		{map[string]any{"mode": "ebpf", "ebpf": map[string]any{"pinDir": "/var/run/steelyard"}}, "pinDir"},
		{map[string]any{"detectLocalMode": "BridgeInterface"}, "detectLocalMode"},
		{map[string]any{"apiServer": "198.19.0.1"}, "apiServer"},
		{map[string]any{"apiServer": "2001:2::1:443"}, "apiServer"},
		{map[string]any{"ingress": map[string]any{"upstreams": "endpoints"}}, "upstreams"},
		{map[string]any{"imag": map[string]any{"tag": "x"}}, "imag"},
		{map[string]any{"extraArgs": []any{"run"}}, "extraArgs"},
	} {
		if _, err := Render(c, tc.vals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one naming %q", tc.vals, err, tc.want)
		}
	}
}

// TestLintFails: a chart the linter should reject is rejected.
func TestLintFails(t *testing.T) {
	if err := Lint(chartDir); err != nil {
		t.Fatalf("the chart: %v", err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "steelyard")
	if err := copyChart(chartDir, bad); err != nil {
		t.Fatal(err)
	}
	// A Deployment without a selector (lint's validateMatchSelector).
	if err := os.WriteFile(filepath.Join(bad, "templates", "40-bad.yaml"), []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  template: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Lint(bad); err == nil || !strings.Contains(err.Error(), "40-bad.yaml") {
		t.Errorf("lint of a Deployment without a selector: %v", err)
	}
}

// copyChart copies the chart's files from src to dst.
func copyChart(src, dst string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if fi.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
}

func TestChartVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v1.2.3":            "1.2.3",
		"v1.2.3-4-gc91b402": "1.2.3-4-gc91b402",
		"v1.2.3-dirty":      "1.2.3-dirty",
		"c91b402":           "0.0.0-gc91b402",
		"c91b402-dirty":     "0.0.0-gc91b402-dirty",
		"0123456":           "0.0.0-g0123456",
		"dev":               "0.0.0-gdev",
		"":                  "0.0.0-dev",
		"feature/x+y":       "0.0.0-gfeature-x-y",
	} {
		if got := chartVersion(in); got != want {
			t.Errorf("chartVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTemplate: template writes the chart rendered with -set values, one
// file a template. make conformance's steelyard-ebpf proxy
// (test/conformance/ebpf.go) renders mode ebpf so and, before applying it,
// gives the volume mount named "cgroup" a subPathExpr per node: that mount
// must exist, at the directory the agent's --cgroup-path names, on a
// hostPath volume of the same name. A value the schema rejects renders
// nothing.
func TestTemplate(t *testing.T) {
	dir := t.TempDir()
	set := setFlags{"mode=ebpf", "ebpf.cgroupPath=/sys/fs/cgroup/unified/c1"}
	if err := cmdTemplate(chartDir, "", dir, set); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, f := range []string{"00-namespace.yaml", "10-rbac.yaml", "20-config.yaml", "30-daemonset.yaml"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = string(b)
	}
	if got := configMaps(t, files)["steelyard-config"]["MODE"]; got != "ebpf" {
		t.Errorf("steelyard-config MODE %q, want ebpf", got)
	}
	spec := daemonSet(t, files).Spec.Template.Spec
	agent := spec.Containers[0]
	var mount *corev1.VolumeMount
	for i := range agent.VolumeMounts {
		if agent.VolumeMounts[i].Name == "cgroup" {
			mount = &agent.VolumeMounts[i]
		}
	}
	if mount == nil || !slices.Contains(agent.Args, "--cgroup-path="+mount.MountPath) {
		t.Errorf("mode ebpf: mount %+v, args %q: want a mount named cgroup at the --cgroup-path", mount, agent.Args)
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "cgroup" && v.HostPath != nil && v.HostPath.Path == "/sys/fs/cgroup/unified/c1"
	}) {
		t.Errorf("mode ebpf: volumes %+v lack the hostPath cgroup /sys/fs/cgroup/unified/c1", spec.Volumes)
	}
	if err := cmdTemplate(chartDir, "", t.TempDir(), setFlags{"mode=ebpf", "ebpf.cgroupPath=/tmp/x"}); err == nil || !strings.Contains(err.Error(), "cgroupPath") {
		t.Errorf("ebpf.cgroupPath=/tmp/x: %v, want the schema's error naming cgroupPath", err)
	}
}
