#!/usr/bin/env bash
# Build (or reuse) the container images the real node runs, without a
# registry, as docker-archive tarballs for `ctr -n k8s.io images import`:
#
#   registry.k8s.io/pause:3.10.2                  the pod sandbox (kubelet 1.37's
#                                                 default; scripts/node/images/pause)
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1 built from
#                                                 k8s.io/kubernetes/test/images/agnhost
#                                                 at v1.37.2 (the version its e2e
#                                                 tests list in test/utils/image)
#   ghcr.io/steelyard-net/steelyard:latest        the Dockerfile's runtime: the
#                                                 debootstrap rootfs of
#                                                 scripts/node/rootfs.sh plus both
#                                                 binaries built from this tree
#   registry.k8s.io/kube-proxy:v1.37.2            the same rootfs (iptables in both
#                                                 flavours, nft, conntrack) plus the
#                                                 control-plane cache's kube-proxy
#                                                 (scripts/control-plane/build.sh): a
#                                                 kube-proxy DaemonSet as users run
#                                                 it (test/node/multinode_vs_kubeproxy_test.go)
#
#   scripts/node/images.sh    build what is missing, print the images dir
#
# Each tarball is cached under $STEELYARD_CACHE/images (default
# $HOME/.cache/steelyard) with a key in its name: the version for agnhost,
# a hash of the sources (or of the binaries and rootfs) for the others.
# Progress goes to stderr; stdout carries only the folder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock node-images
dir=$cache/images
go=${GO:-go}
pause_version=3.10.2
agnhost_version=2.66.1 # k8s.io/kubernetes v1.37.2 test/utils/image/manifest.go
k8s_version=v1.37.2
steelyard_ref=${STEELYARD_IMAGE:-ghcr.io/steelyard-net/steelyard:latest}
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The image assembler (go-containerregistry), its own module.
(cd "$here/images" && CGO_ENABLED=0 "$go" build -trimpath -o "$tmp/imagebuild" .)

hash() { cat "$@" | sha256sum | cut -c1-12; }

# pause: keyed by its source and the Go version.
key=$( (cat "$here/images/pause/main.go"; "$go" version) | sha256sum | cut -c1-12)
pause=$dir/pause-$pause_version-$key.tar
if [[ ! -s $pause ]]; then
	t0=$(date +%s)
	(cd "$here/images" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$tmp/pause" ./pause)
	"$tmp/imagebuild" --name "registry.k8s.io/pause:$pause_version" --out "$pause" \
		--file "$tmp/pause:/pause:0755" --entrypoint /pause
	echo "images: pause built in $(($(date +%s) - t0)) s" >&2
fi

# agnhost: keyed by its version (it comes from k8s.io/kubernetes $k8s_version)
# and the pause image it carries: upstream's image fills /var/registry with
# registry.k8s.io's pause:3.10.2 as pause:testing for fake-registry-server
# (the e2e LocalhostNodePorts test pulls it through a localhost node port);
# ours lays out our pause image there (images/main.go --registry).
agnhost=$dir/agnhost-$agnhost_version-$(basename "$pause" .tar | sed 's/^pause-//').tar
if [[ ! -s $agnhost ]]; then
	t0=$(date +%s)
	(cd "$here/agnhost" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
	"$tmp/agnhost" --help >/dev/null
	"$tmp/imagebuild" --name "registry.k8s.io/e2e-test-images/agnhost:$agnhost_version" --out "$agnhost" \
		--file "$tmp/agnhost:/agnhost:0755" --registry "$pause:pause:testing" --entrypoint /agnhost
	echo "images: agnhost $agnhost_version (k8s.io/kubernetes $k8s_version) built in $(($(date +%s) - t0)) s" >&2
fi

# steelyard: the rootfs (cached by its own key) and the binaries of this
# tree, built as the Dockerfile builds them; keyed by all three.
t0=$(date +%s)
rootfs=$("$here/rootfs.sh")
version=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo dev)
(cd "$repo" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X main.version=$version" -o "$tmp/steelyard" ./cmd/steelyard)
(cd "$repo" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w -X main.buildVersion=$version" -o "$tmp/steelyard-cni" ./cmd/steelyard-cni)
key=$( (basename "$rootfs"; echo "$steelyard_ref"; cat "$tmp/steelyard" "$tmp/steelyard-cni") | sha256sum | cut -c1-12)
steelyard=$dir/steelyard-$key.tar
if [[ ! -s $steelyard ]]; then
	"$tmp/imagebuild" --name "$steelyard_ref" --out "$steelyard" --layer "$rootfs" \
		--file "$tmp/steelyard:/usr/local/bin/steelyard:0755" \
		--file "$tmp/steelyard-cni:/usr/local/bin/steelyard-cni:0755" \
		--entrypoint /usr/local/bin/steelyard --cmd run
	# Older steelyard images are garbage; by age, not count, so another
	# checkout building at the same time keeps the one its set points at.
	find "$dir" -maxdepth 1 -name 'steelyard-*.tar' -mmin +720 -delete
	echo "images: steelyard image built in $(($(date +%s) - t0)) s" >&2
fi
# kube-proxy: the control plane's binary on the steelyard rootfs (the
# official image is distroless plus iptables and nft; ours shares the
# rootfs layer, so a node that has the steelyard image stores it once).
# Keyed by the rootfs and the binary.
k8s_bin=$("$repo/scripts/control-plane/build.sh" | sed -n 1p)
key=$( (basename "$rootfs"; cat "$k8s_bin/kube-proxy") | sha256sum | cut -c1-12)
kube_proxy=$dir/kube-proxy-$k8s_version-$key.tar
if [[ ! -s $kube_proxy ]]; then
	t0=$(date +%s)
	"$tmp/imagebuild" --name "registry.k8s.io/kube-proxy:$k8s_version" --out "$kube_proxy" --layer "$rootfs" \
		--file "$k8s_bin/kube-proxy:/usr/local/bin/kube-proxy:0755" \
		--entrypoint /usr/local/bin/kube-proxy
	find "$dir" -maxdepth 1 -name 'kube-proxy-*.tar' ! -name "$(basename "$kube_proxy")" -mmin +720 -delete
	echo "images: kube-proxy $k8s_version image built in $(($(date +%s) - t0)) s" >&2
fi
# The set the node imports: one file per image, named by role, in this
# checkout (bin/images), so that checkouts building at once each test their
# own tree (a shared set in the cache was repointed by whoever built last).
set_dir=$repo/bin/images
mkdir -p "$set_dir"
ln -sfn "$pause" "$set_dir/pause.tar"
ln -sfn "$agnhost" "$set_dir/agnhost.tar"
ln -sfn "$steelyard" "$set_dir/steelyard.tar"
ln -sfn "$kube_proxy" "$set_dir/kube-proxy.tar"
echo "$set_dir"
