package cluster

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/steelyard-net/steelyard/test/controlplane"
)

// Versions of what scripts/node builds; they name the cache directories.
const (
	ContainerdVersion = "v2.3.7"
	CNIPluginsVersion = "v1.10.0"
)

// Environment variables that override the cache locations (the Makefile's
// node target sets them from the scripts' output).
const (
	EnvContainerdDir = "STEELYARD_CONTAINERD_DIR" // containerd, containerd-shim-runc-v2, ctr
	EnvCNIPluginsDir = "CNI_PLUGINS_DIR"          // bridge, loopback, host-local, portmap
	EnvImagesDir     = "STEELYARD_IMAGES_DIR"     // pause.tar, agnhost.tar, steelyard.tar
)

// BuildHint says how to build what is missing.
const BuildHint = "run `make node` (scripts/node/containerd.sh, scripts/cni-plugins.sh, scripts/node/images.sh, scripts/control-plane/build.sh)"

// Binaries are every executable and image the node needs.
type Binaries struct {
	controlplane.Binaries
	KubeControllerManager, KubeScheduler, Kubelet string
	Containerd, Ctr, ContainerdShimDir            string
	Runc                                          string
	CNIPluginsDir                                 string
	// Images are docker-archive tarballs imported into containerd's k8s.io
	// namespace.
	Images []string
}

// FindBinaries locates everything; the error lists what is missing.
func FindBinaries() (Binaries, error) {
	var b Binaries
	var missing []string
	cpb, err := controlplane.FindBinaries()
	if err != nil {
		missing = append(missing, err.Error())
	}
	b.Binaries = cpb
	cache, err := controlplane.CacheDir()
	if err != nil {
		return b, err
	}
	k8s := filepath.Dir(cpb.KubeAPIServer)
	b.KubeControllerManager = filepath.Join(k8s, "kube-controller-manager")
	b.KubeScheduler = filepath.Join(k8s, "kube-scheduler")
	b.Kubelet = filepath.Join(k8s, "kubelet")
	cd := envOr(EnvContainerdDir, filepath.Join(cache, "containerd-"+ContainerdVersion))
	b.Containerd, b.Ctr, b.ContainerdShimDir = filepath.Join(cd, "containerd"), filepath.Join(cd, "ctr"), cd
	b.Runc = envOr("STEELYARD_RUNC", "/usr/sbin/runc")
	b.CNIPluginsDir = envOr(EnvCNIPluginsDir, filepath.Join(cache, "cni-plugins-"+CNIPluginsVersion))
	images := envOr(EnvImagesDir, filepath.Join(cache, "images"))
	b.Images = []string{filepath.Join(images, "pause.tar"), filepath.Join(images, "agnhost.tar"), filepath.Join(images, "steelyard.tar")}
	files := []string{b.KubeControllerManager, b.KubeScheduler, b.Kubelet, b.Containerd, b.Ctr,
		filepath.Join(cd, "containerd-shim-runc-v2"), b.Runc,
		filepath.Join(b.CNIPluginsDir, "bridge"), filepath.Join(b.CNIPluginsDir, "loopback"), filepath.Join(b.CNIPluginsDir, "host-local"), filepath.Join(b.CNIPluginsDir, "portmap")}
	for _, f := range append(files, b.Images...) {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, err.Error())
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("real node: missing %v; %s", missing, BuildHint)
	}
	return b, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
