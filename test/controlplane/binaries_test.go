package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindBinaries(t *testing.T) {
	k8s, etcd := t.TempDir(), t.TempDir()
	t.Setenv(EnvK8sBin, k8s)
	t.Setenv(EnvEtcdBin, etcd)

	_, err := FindBinaries()
	if err == nil {
		t.Fatal("FindBinaries found binaries in empty directories")
	}
	for _, want := range []string{"kube-apiserver", "kubectl", "kube-proxy", "etcd", "make control-plane"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}

	for _, p := range []string{
		filepath.Join(k8s, "kube-apiserver"), filepath.Join(k8s, "kubectl"),
		filepath.Join(k8s, "kube-proxy"), filepath.Join(etcd, "etcd"),
	} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	if b.KubeProxy != filepath.Join(k8s, "kube-proxy") || b.Etcd != filepath.Join(etcd, "etcd") {
		t.Errorf("FindBinaries = %+v", b)
	}
}

func TestFindBinariesCache(t *testing.T) {
	cache := t.TempDir()
	t.Setenv(EnvK8sBin, "")
	t.Setenv(EnvEtcdBin, "")
	t.Setenv(EnvCache, cache)
	b, _ := FindBinaries()
	if want := filepath.Join(cache, "k8s-"+KubernetesVersion, "kube-apiserver"); b.KubeAPIServer != want {
		t.Errorf("KubeAPIServer = %s, want %s", b.KubeAPIServer, want)
	}
	if want := filepath.Join(cache, "etcd-"+EtcdVersion, "etcd"); b.Etcd != want {
		t.Errorf("Etcd = %s, want %s", b.Etcd, want)
	}
}
