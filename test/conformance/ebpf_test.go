package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

// steelyard-ebpf is a known proxy, in the table's order after the other
// steelyard modes, but not run by default until it has run once (the
// lead adds it to defaultProxies then); --proxies picks it.
func TestProxies(t *testing.T) {
	def, err := parseProxies("")
	if err != nil || !slices.Equal(def, []string{"steelyard-iptables", "steelyard-nftables", "kube-proxy", "kube-proxy-nftables"}) {
		t.Errorf("default proxies %q, %v", def, err)
	}
	for _, p := range def {
		if !slices.Contains(proxies, p) {
			t.Errorf("default proxy %s is not a known one", p)
		}
	}
	if i := slices.Index(proxies, ebpfProxy); i != 2 || !isSteelyard(ebpfProxy) {
		t.Errorf("%s at %d of %q (isSteelyard %v), want after steelyard-nftables, judged as steelyard", ebpfProxy, i, proxies, isSteelyard(ebpfProxy))
	}
	got, err := parseProxies(" steelyard-ebpf, kube-proxy-nftables ,")
	if err != nil || !slices.Equal(got, []string{"steelyard-ebpf", "kube-proxy-nftables"}) {
		t.Errorf("parseProxies: %q, %v", got, err)
	}
	if _, err := parseProxies("steelyard-ebpf,cilium"); err == nil || !strings.Contains(err.Error(), `"cilium"`) {
		t.Errorf("unknown proxy: %v", err)
	}
}

// The chart's mode ebpf DaemonSet, as steelyard-chart template renders it
// (the fields the runner reads; test/chart's TestTemplate checks that the
// chart keeps them so).
const ebpfDaemonSet = `# comment
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: steelyard
  namespace: steelyard
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: steelyard}
  template:
    metadata:
      labels: {app.kubernetes.io/name: steelyard}
    spec:
      hostNetwork: true
      initContainers:
      - name: install-cni
        image: ghcr.io/steelyard-net/steelyard:latest
        volumeMounts:
        - {name: cni-bin, mountPath: /host/opt/cni/bin}
      containers:
      - name: steelyard
        image: ghcr.io/steelyard-net/steelyard:latest
        args: [run, --mode=$(MODE), --node-name=$(NODE_NAME), --cgroup-path=/host/cgroup, --bpf-pin-dir=/sys/fs/bpf/steelyard]
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        volumeMounts:
        - {name: bpffs, mountPath: /sys/fs/bpf, mountPropagation: HostToContainer}
        - {name: cgroup, mountPath: /host/cgroup, readOnly: true}
      volumes:
      - {name: bpffs, hostPath: {path: /sys/fs/bpf, type: Directory}}
      - {name: cgroup, hostPath: {path: /sys/fs/cgroup/unified/steelyard-node-1-x, type: Directory}}
      - {name: cni-bin, hostPath: {path: /opt/cni/bin}}
`

// The values render mode ebpf on the given cgroup, and perNodeCgroup
// narrows the agent's cgroup mount, and nothing else, to the node's
// sub-cgroup; a DaemonSet without the ebpf mount, or whose --cgroup-path
// names another directory, is an error, not a DaemonSet that attaches
// elsewhere.
func TestPerNodeCgroup(t *testing.T) {
	if got := ebpfValues("/sys/fs/cgroup/unified/c"); !slices.Equal(got, []string{"mode=ebpf", "ebpf.cgroupPath=/sys/fs/cgroup/unified/c"}) {
		t.Errorf("ebpfValues: %q", got)
	}
	out, err := perNodeCgroup([]byte(ebpfDaemonSet), cluster.NodeNameVar)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(out, &ds); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var in appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(ebpfDaemonSet), &in); err != nil {
		t.Fatal(err)
	}
	mounts := ds.Spec.Template.Spec.Containers[0].VolumeMounts
	if m := mounts[1]; m.Name != "cgroup" || m.SubPathExpr != "$(NODE_NAME)" || m.MountPath != "/host/cgroup" || !m.ReadOnly {
		t.Errorf("cgroup mount %+v, want /host/cgroup read-only with subPathExpr $(NODE_NAME)", m)
	}
	// Everything else as rendered.
	ds.Spec.Template.Spec.Containers[0].VolumeMounts[1].SubPathExpr = ""
	a, _ := yaml.Marshal(&ds)
	b, _ := yaml.Marshal(&in)
	if string(a) != string(b) {
		t.Errorf("perNodeCgroup changed more than the cgroup mount:\n%s\nwant\n%s", a, b)
	}
	if !strings.HasPrefix(string(out), "# ") {
		t.Errorf("no header saying the file was changed:\n%s", out)
	}
	for name, bad := range map[string]string{
		"no cgroup volume":          strings.Replace(ebpfDaemonSet, "{name: cgroup, hostPath", "{name: other, hostPath", 1),
		"no cgroup mount":           strings.Replace(ebpfDaemonSet, "{name: cgroup, mountPath", "{name: other, mountPath", 1),
		"--cgroup-path elsewhere":   strings.Replace(ebpfDaemonSet, "--cgroup-path=/host/cgroup", "--cgroup-path=/sys/fs/cgroup", 1),
		"a subPath already":         strings.Replace(ebpfDaemonSet, "mountPath: /host/cgroup,", "mountPath: /host/cgroup, subPath: n1,", 1),
		"not a DaemonSet's fields":  strings.Replace(ebpfDaemonSet, "hostNetwork: true", "hostNetwrk: true", 1),
		"mode ebpf on another name": strings.Replace(ebpfDaemonSet, "- name: steelyard\n", "- name: agent\n", 1),
	} {
		if bad == ebpfDaemonSet {
			t.Fatalf("%s: the fixture did not change", name)
		}
		if _, err := perNodeCgroup([]byte(bad), cluster.NodeNameVar); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// steelyard-ebpf's summary is docs/conformance/steelyard-ebpf.json (make
// docs renders every file there), and its failures fail the run and are
// compared with kube-proxy's, as the other steelyard modes'.
func TestEBPFSummary(t *testing.T) {
	const spec = "[sig-network] Services should be rejected when no endpoints exist [Conformance]"
	r, l := fixture(t, ebpfProxy)
	s := summarize(r, l, Summary{Commit: "abc1234", Nodes: 3, DualStack: true})
	dir := t.TempDir()
	p, err := writeSummary(dir, s)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(dir, "steelyard-ebpf.json") || s.Proxy != "steelyard-ebpf" {
		t.Errorf("summary %s of proxy %q", p, s.Proxy)
	}
	if why := verdict([]result{r}); !strings.Contains(why, "steelyard-ebpf: 1 failed") {
		t.Errorf("verdict %q", why)
	}
	ref := result{proxy: "kube-proxy-nftables", Outcome: Outcome{Passed: []string{spec}}}
	if got := render([]result{r, ref}, l, "/nonexistent", "/nonexistent", 3); !strings.Contains(got, "failed for steelyard-ebpf, passed for kube-proxy (either mode): 1\n  "+spec) {
		t.Errorf("table:\n%s", got)
	}
}
