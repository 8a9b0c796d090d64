package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"sigs.k8s.io/yaml"

	appsv1 "k8s.io/api/apps/v1"
)

// TestInstallUpgradeReuseValues: install with apiServer and clusterCIDR,
// then upgrade with only mode=nftables (as the node suite does), against
// Helm's in-memory release store and printing client: the upgraded release
// keeps the install's values, has MODE nftables, a new config hash on the
// pod template, and the build's versions.
func TestInstallUpgradeReuseValues(t *testing.T) {
	// The node's Kubernetes (Helm's default capabilities say v1.20).
	kv, err := common.ParseKubeVersion("v1.37.2")
	if err != nil {
		t.Fatal(err)
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: caps,
	}
	tg := releaseTarget{name: "steelyard", namespace: "default", timeout: time.Minute}
	r1, err := install(cfg, chartDir, "c91b402-dirty", tg, setFlags{"apiServer=198.19.0.1:6443", "clusterCIDR=198.19.64.0/18"})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := upgrade(cfg, chartDir, "c91b402-dirty", tg, setFlags{"mode=nftables"})
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := release.NewAccessor(r1)
	a2, err := release.NewAccessor(r2)
	if err != nil {
		t.Fatal(err)
	}
	if a2.Version() != 2 || a2.Status() != "deployed" {
		t.Errorf("upgrade: revision %d status %s, want 2 deployed", a2.Version(), a2.Status())
	}
	meta, err := chartMeta(a2)
	if err != nil || meta != [2]string{"0.0.0-gc91b402-dirty", "c91b402-dirty"} {
		t.Errorf("chart version, appVersion = %v %v", meta, err)
	}
	for _, want := range []string{`MODE: "nftables"`, `CLUSTER_CIDR: "198.19.64.0/18"`, `KUBERNETES_SERVICE_HOST: "198.19.0.1"`} {
		if !strings.Contains(a2.Manifest(), want) {
			t.Errorf("upgraded manifest lacks %s", want)
		}
	}
	if h1, h2 := configHash(t, a1.Manifest()), configHash(t, a2.Manifest()); h1 == "" || h1 == h2 {
		t.Errorf("config hash %q -> %q: want a change, so the DaemonSet rolls", h1, h2)
	}
}

// configHash is the DaemonSet's steelyard.io/config-hash in a release
// manifest.
func configHash(t *testing.T, manifest string) string {
	t.Helper()
	for _, d := range docs(manifest) {
		if !strings.Contains(d, "kind: DaemonSet") {
			continue
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(d), &ds); err != nil {
			t.Fatal(err)
		}
		return ds.Spec.Template.Annotations["steelyard.io/config-hash"]
	}
	t.Fatal("no DaemonSet in the manifest")
	return ""
}
