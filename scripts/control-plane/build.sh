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

# The versions are the ones the wrapper modules require, so go.mod stays
# the single place to change them.
required() { # module dir
	awk -v m="$1" '($1 == "require" && $2 == m) { print $3 } ($1 == m && $2 ~ /^v/) { print $2 }' "$2/go.mod" | head -n1
}
k8s_version=$(required k8s.io/kubernetes "$here/k8s")
etcd_version=$(required go.etcd.io/etcd/server/v3 "$here/etcd")
[[ $k8s_version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || {
	echo "build.sh: cannot read the k8s.io/kubernetes version from $here/k8s/go.mod" >&2
	exit 1
}
k8s_major=${BASH_REMATCH[1]} k8s_minor=${BASH_REMATCH[2]}
[[ $etcd_version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || {
	echo "build.sh: cannot read the etcd version from $here/etcd/go.mod" >&2
	exit 1
}

k8s_bin=$cache/k8s-$k8s_version
etcd_bin=$cache/etcd-$etcd_version

# reports <binary> <version> <args...>: the binary runs and prints the version.
reports() {
	local bin=$1 want=$2 out
	shift 2
	[[ -x $bin ]] || return 1
	out=$("$bin" "$@" 2>&1) || return 1
	[[ $out == *"$want"* ]]
}

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

# build_into <final dir> <module dir> <ldflags> <output name> <packages...>:
# builds into a temporary directory beside the final one and renames it
# into place, so an interrupted build never leaves a half-written cache
# behind. With an empty output name each binary is named after its package.
build_into() {
	local dest=$1 mod=$2 ldflags=$3 out=$4
	shift 4
	mkdir -p "$cache"
	local tmp
	tmp=$(mktemp -d "$dest.tmp.XXXXXX")
	chmod 755 "$tmp" # mktemp makes it 0700; others (sudo, CI users) read the cache
	# shellcheck disable=SC2064 # expand $tmp now
	trap "rm -rf '$tmp'" EXIT
	(cd "$mod" && "$go" build -ldflags "$ldflags" -o "$tmp/$out" "$@")
	rm -rf "$dest"
	mv "$tmp" "$dest"
	trap - EXIT
}

if $force || ! etcd_ok; then
	log "building etcd $etcd_version into $etcd_bin (cold: about 1 min)"
	start=$SECONDS
	build_into "$etcd_bin" "$here/etcd" "-s -w" etcd go.etcd.io/etcd/server/v3
	etcd_ok || {
		echo "build.sh: $etcd_bin/etcd does not report $etcd_version" >&2
		exit 1
	}
	log "etcd built in $((SECONDS - start)) s"
fi

if $force || ! k8s_ok; then
	log "building kube-apiserver, kubectl, kube-proxy, kube-controller-manager, kube-scheduler, kubelet $k8s_version into $k8s_bin (cold: about 8-10 min)"
	start=$SECONDS
	v=k8s.io/component-base/version
	build_into "$k8s_bin" "$here/k8s" \
		"-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=$k8s_major -X $v.gitMinor=$k8s_minor -X $v.gitTreeState=clean" "" \
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
