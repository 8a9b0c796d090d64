#!/usr/bin/env bash
# Build (once) and cache the reference CNI plugins the CNI test suite chains
# steelyard-cni after (and the real node runs): bridge, loopback, host-local and portmap from
# github.com/containernetworking/plugins, built from source through the Go
# module proxy (`go install module/path@version`; no prebuilt downloads).
#
#   scripts/cni-plugins.sh           build if needed, print the bin dir
#   scripts/cni-plugins.sh --force   rebuild even if the cache is good
#
# Cached under $STEELYARD_CACHE (default $HOME/.cache/steelyard) in
# cni-plugins-<version>/. Progress goes to stderr; stdout carries only the
# folder.
set -euo pipefail

version=${CNI_PLUGINS_VERSION:-v1.10.0}
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/lock.sh"
cache_lock cni-plugins
dir=$cache/cni-plugins-$version
go=${GO:-go}
plugins=(main/bridge main/loopback ipam/host-local meta/portmap)

# shellcheck source=lib/args.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/args.sh"
cache_args 12 "$@"

cached() {
	local p
	for p in "${plugins[@]}"; do
		[[ -x $dir/$(basename "$p") ]] || return 1
	done
	# .version is written last, after every binary built.
	[[ -f $dir/.version && $(cat "$dir/.version") == "$version" ]]
}

if ! $force && cached; then
	echo "cni-plugins: cached in $dir" >&2
	echo "$dir"
	exit 0
fi

echo "cni-plugins: building ${plugins[*]} $version through the Go module proxy into $dir" >&2
start=$(date +%s)
tmp=$(mktemp -d "$cache/.cni-plugins-$version.XXXXXX" 2>/dev/null || { mkdir -p "$cache" && mktemp -d "$cache/.cni-plugins-$version.XXXXXX"; })
trap 'rm -rf "$tmp"' EXIT
for p in "${plugins[@]}"; do
	# Outside any module, so the project's go.mod plays no part.
	(cd "$tmp" && GOBIN=$tmp GOFLAGS=-trimpath CGO_ENABLED=0 GO111MODULE=on "$go" install \
		-ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$version" \
		"github.com/containernetworking/plugins/plugins/$p@$version")
done
chmod 755 "$tmp"
echo "$version" >"$tmp/.version"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "cni-plugins: built in $(($(date +%s) - start)) s" >&2
echo "$dir"
