#!/usr/bin/env bash
# Build (once) and cache the binaries of a real control plane for tests and
# benchmarks: kube-apiserver, kubectl, kube-proxy, kube-controller-manager,
# kube-scheduler and kubelet from k8s.io/kubernetes,
# and etcd. Everything comes from source through the Go module proxy, using
# the wrapper modules beside this script (k8s/ and etcd/), whose go.mod pins
# the versions. No prebuilt binaries are downloaded.
#
#   scripts/control-plane/build.sh              build if needed, print the bin dirs
#   scripts/control-plane/build.sh --print-env  ... print STEELYARD_K8S_BIN=... STEELYARD_ETCD_BIN=...
#   scripts/control-plane/build.sh --force      rebuild even if the cache is good
#
# Binaries are cached by version under $STEELYARD_CACHE (default
# $HOME/.cache/steelyard): k8s-<version>/ and etcd-<version>/. When every
# binary is there and reports the expected version, nothing is built.
# test/controlplane looks in the same place.
#
# A cold build takes about 8-10 minutes on 2 cores (kube-apiserver is most
# of it), downloads about 130 MB of modules and fills about 3 GB of Go
# build cache. Progress goes to stderr; stdout carries only the result.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock control-plane
go=${GO:-go}

mode=dirs
force=false
for arg in "$@"; do
	case $arg in
	--print-env) mode=env ;;
	--force) force=true ;;
	-h | --help)
		sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "build.sh: unknown argument $arg (try --help)" >&2
		exit 2
		;;
	esac
done

log() { echo "control-plane: $*" >&2; }

# The helpers (required, reports, k8s_ldflags, build_into) are shared with
# scripts/conformance/build.sh. The versions are the ones the wrapper
# modules require, so go.mod stays the single place to change them.
# shellcheck source=lib.sh
. "$here/lib.sh"
k8s_version=$(required k8s.io/kubernetes "$here/k8s")
etcd_version=$(required go.etcd.io/etcd/server/v3 "$here/etcd")
[[ $k8s_version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || {
	echo "build.sh: cannot read the k8s.io/kubernetes version from $here/k8s/go.mod" >&2
	exit 1
}
[[ $etcd_version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || {
	echo "build.sh: cannot read the etcd version from $here/etcd/go.mod" >&2
	exit 1
}

k8s_bin=$cache/k8s-$k8s_version
etcd_bin=$cache/etcd-$etcd_version

k8s_ok() {
	reports "$k8s_bin/kube-apiserver" "$k8s_version" --version &&
		reports "$k8s_bin/kube-proxy" "$k8s_version" --version &&
		reports "$k8s_bin/kubectl" "$k8s_version" version --client &&
		reports "$k8s_bin/kube-controller-manager" "$k8s_version" --version &&
		reports "$k8s_bin/kube-scheduler" "$k8s_version" --version &&
		reports "$k8s_bin/kubelet" "$k8s_version" --version
}

etcd_ok() {
	reports "$etcd_bin/etcd" "etcd Version: ${etcd_version#v}" --version
}

# Reproducible, static, small binaries; the module graph must come from
# the committed go.mod/go.sum as they are.
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
unset GOWORK GOOS GOARCH

# go_build <out dir> <ldflags> <output name> <packages...>: with an empty
# output name each binary is named after its package.
go_build() {
	local out=$1 ldflags=$2 name=$3
	shift 3
	"$go" build -ldflags "$ldflags" -o "$out/$name" "$@"
}

if $force || ! etcd_ok; then
	log "building etcd $etcd_version into $etcd_bin (cold: about 1 min)"
	start=$SECONDS
	build_into "$etcd_bin" "$here/etcd" go_build "-s -w" etcd go.etcd.io/etcd/server/v3
	etcd_ok || {
		echo "build.sh: $etcd_bin/etcd does not report $etcd_version" >&2
		exit 1
	}
	log "etcd built in $((SECONDS - start)) s"
fi

if $force || ! k8s_ok; then
	log "building kube-apiserver, kubectl, kube-proxy, kube-controller-manager, kube-scheduler, kubelet $k8s_version into $k8s_bin (cold: about 8-10 min)"
	start=$SECONDS
	build_into "$k8s_bin" "$here/k8s" go_build "$(k8s_ldflags "$k8s_version")" "" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kube-proxy \
		k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet
	k8s_ok || {
		echo "build.sh: the binaries in $k8s_bin do not report $k8s_version" >&2
		exit 1
	}
	log "kubernetes built in $((SECONDS - start)) s"
fi

case $mode in
env) echo "STEELYARD_K8S_BIN=$k8s_bin STEELYARD_ETCD_BIN=$etcd_bin" ;;
dirs) printf '%s\n%s\n' "$k8s_bin" "$etcd_bin" ;;
esac
