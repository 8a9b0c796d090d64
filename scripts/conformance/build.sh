#!/usr/bin/env bash
# Build (once) and cache Kubernetes' end-to-end suite for the conformance
# run (make conformance): e2e.test (`go test -c k8s.io/kubernetes/test/e2e`)
# and the ginkgo CLI at the version k8s.io/kubernetes's go.mod requires.
# Both come from the control plane's wrapper module
# (scripts/control-plane/k8s), whose go.mod pins k8s.io/kubernetes and
# lists ginkgo as a tool; nothing prebuilt is downloaded.
#
#   scripts/conformance/build.sh           build if needed, print the bin dir
#   scripts/conformance/build.sh --force   rebuild even if the cache is good
#
# Cached under $STEELYARD_CACHE (default $HOME/.cache/steelyard) as
# e2e-<k8s version>/{e2e.test,ginkgo}; nothing is built when both report
# their versions. Progress goes to stderr; stdout carries only the dir.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cp=$here/../control-plane
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock conformance-build
go=${GO:-go}
# shellcheck source=../lib/args.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh"
cache_args 14 "$@"

# shellcheck source=../control-plane/lib.sh
. "$cp/lib.sh"
k8s_version=$(required k8s.io/kubernetes "$cp/k8s")
ginkgo_version=$(required github.com/onsi/ginkgo/v2 "$cp/k8s")
[[ -n $k8s_version && -n $ginkgo_version ]] || {
	echo "build.sh: cannot read the k8s.io/kubernetes and ginkgo versions from $cp/k8s/go.mod" >&2
	exit 1
}
dir=$cache/e2e-$k8s_version

ok() {
	reports "$dir/e2e.test" "$k8s_version" --version &&
		reports "$dir/ginkgo" "${ginkgo_version#v}" version
}

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath"
unset GOWORK GOOS GOARCH

build() { # out dir
	"$go" test -c -vet=off -ldflags "$(k8s_ldflags "$k8s_version")" -o "$1/e2e.test" k8s.io/kubernetes/test/e2e
	"$go" build -ldflags "-s -w" -o "$1/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
}

if $force || ! ok; then
	echo "conformance: building e2e.test $k8s_version and ginkgo $ginkgo_version into $dir (cold: about 10 min)" >&2
	start=$SECONDS
	build_into "$dir" "$cp/k8s" build
	ok || {
		echo "build.sh: $dir does not hold e2e.test $k8s_version and ginkgo $ginkgo_version" >&2
		exit 1
	}
	echo "conformance: built in $((SECONDS - start)) s" >&2
fi
echo "$dir"
