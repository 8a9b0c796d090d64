#!/usr/bin/env bash
# Build (once) and cache containerd and its runc shim from the Go module
# proxy (no prebuilt downloads): github.com/containerd/containerd/v2's
# cmd/containerd and cmd/containerd-shim-runc-v2, static (CGO_ENABLED=0),
# with the build tags upstream's Makefile uses (urfave_cli_no_docs; no_grpc
# for the shim). ctr comes along for `ctr images import`. runc itself is
# Debian's (scripts/install-deps.sh).
#
#   scripts/node/containerd.sh           build if needed, print the bin dir
#   scripts/node/containerd.sh --force   rebuild even if the cache is good
#
# Cached under $STEELYARD_CACHE (default $HOME/.cache/steelyard) in
# containerd-<version>/. Progress goes to stderr; stdout carries only the
# folder.
set -euo pipefail

version=${CONTAINERD_VERSION:-v2.3.7}
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock containerd
dir=$cache/containerd-$version
go=${GO:-go}
mod=github.com/containerd/containerd/v2
bins=(containerd containerd-shim-runc-v2 ctr)

# shellcheck source=../lib/args.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/args.sh"
cache_args 14 "$@"

cached() {
	local b
	for b in "${bins[@]}"; do
		[[ -x $dir/$b ]] || return 1
	done
	# .version is written last, after every binary built.
	[[ -f $dir/.version && $(cat "$dir/.version") == "$version" ]]
}

if ! $force && cached; then
	echo "containerd: cached in $dir" >&2
	echo "$dir"
	exit 0
fi

echo "containerd: building ${bins[*]} $version through the Go module proxy into $dir" >&2
start=$(date +%s)
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.containerd-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ldflags="-s -w -X $mod/version.Version=$version -X $mod/version.Package=$mod"
build() { # build <cmd> <tags>
	# Outside any module, so the project's go.mod plays no part.
	(cd "$tmp" && GOBIN=$tmp GOFLAGS=-trimpath CGO_ENABLED=0 GO111MODULE=on "$go" install \
		-tags "$2" -ldflags "$ldflags" "$mod/cmd/$1@$version")
}
build containerd urfave_cli_no_docs
build ctr urfave_cli_no_docs
build containerd-shim-runc-v2 "urfave_cli_no_docs no_grpc"
chmod 755 "$tmp"
echo "$version" >"$tmp/.version"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "containerd: built in $(($(date +%s) - start)) s" >&2
echo "$dir"
