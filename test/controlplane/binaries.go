package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The versions scripts/control-plane/build.sh builds; they name the cache
// directories. Keep them in step with scripts/control-plane/*/go.mod.
const (
	KubernetesVersion = "v1.37.2"
	EtcdVersion       = "v3.7.3"
)

// Environment variables that point at directories holding the binaries,
// overriding the cache (`scripts/control-plane/build.sh --print-env`).
const (
	EnvK8sBin  = "STEELYARD_K8S_BIN"  // kube-apiserver, kubectl, kube-proxy
	EnvEtcdBin = "STEELYARD_ETCD_BIN" // etcd
	EnvCache   = "STEELYARD_CACHE"    // default $HOME/.cache/steelyard
)

// BuildHint is what to run when the binaries are missing.
const BuildHint = "run `make control-plane` (scripts/control-plane/build.sh) to build and cache them"

// Binaries are the paths of the control plane's executables.
type Binaries struct {
	KubeAPIServer string
	Kubectl       string
	KubeProxy     string
	Etcd          string
}

// CacheDir is where build.sh caches the binaries: $STEELYARD_CACHE, else
// $HOME/.cache/steelyard.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCache); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("cannot find the steelyard cache: %w", err)
	}
	return filepath.Join(home, ".cache", "steelyard"), nil
}

// FindBinaries locates the binaries: in $STEELYARD_K8S_BIN and
// $STEELYARD_ETCD_BIN when set, else in the version-keyed cache
// directories (k8s-v1.37.2/ and etcd-v3.7.3/ under CacheDir). The error
// lists every missing file and says how to build them.
func FindBinaries() (Binaries, error) {
	k8sDir, etcdDir := os.Getenv(EnvK8sBin), os.Getenv(EnvEtcdBin)
	if k8sDir == "" || etcdDir == "" {
		cache, err := CacheDir()
		if err != nil {
			return Binaries{}, fmt.Errorf("%w; or set %s and %s", err, EnvK8sBin, EnvEtcdBin)
		}
		if k8sDir == "" {
			k8sDir = filepath.Join(cache, "k8s-"+KubernetesVersion)
		}
		if etcdDir == "" {
			etcdDir = filepath.Join(cache, "etcd-"+EtcdVersion)
		}
	}
	b := Binaries{
		KubeAPIServer: filepath.Join(k8sDir, "kube-apiserver"),
		Kubectl:       filepath.Join(k8sDir, "kubectl"),
		KubeProxy:     filepath.Join(k8sDir, "kube-proxy"),
		Etcd:          filepath.Join(etcdDir, "etcd"),
	}
	var missing []string
	for _, p := range []string{b.KubeAPIServer, b.Kubectl, b.KubeProxy, b.Etcd} {
		if err := executable(p); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("control plane binaries (Kubernetes %s, etcd %s) missing: %s; %s",
			KubernetesVersion, EtcdVersion, strings.Join(missing, "; "), BuildHint)
	}
	return b, nil
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}
