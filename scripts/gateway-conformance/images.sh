#!/usr/bin/env bash
# Build (or reuse) the backend image of the Gateway API conformance suite:
# echo-basic from sigs.k8s.io/gateway-api/conformance/echo-basic at the
# version test/gatewayconformance/go.mod requires, one static binary in a
# docker-archive tarball (scripts/node/images' assembler, go-containerregistry),
# once under each name the suite's manifests use (they pin three tags of the
# same program; nothing is pulled, so each name must be present), and
# CoreDNS at the version the suite's base manifests name (UDPRouteSimple's
# DNS backend; every pod of the infra namespace must be Ready before any
# test runs), built from github.com/coredns/coredns through the module proxy.
#
#   scripts/gateway-conformance/images.sh   print the tarballs, one a line
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mod=$repo/test/gatewayconformance
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock gateway-conformance-images
dir=$cache/images
go=${GO:-go}
mkdir -p "$dir"
version=$(cd "$mod" && "$go" list -m -f '{{.Version}}' sigs.k8s.io/gateway-api/conformance)
src=$(cd "$mod" && "$go" list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)
# The names: every echo-basic image the suite's manifests name.
mapfile -t names < <(grep -rhoE 'registry\.k8s\.io/gateway-api/echo-basic:[^"[:space:]]+' "$src/base" "$src/tests" | sort -u)
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
need=0
for n in "${names[@]}"; do
	[[ -s $dir/echo-basic-$version-${n##*:}.tar ]] || need=1
done
if ((need)); then
	t0=$(date +%s)
	(cd "$repo/scripts/node/images" && CGO_ENABLED=0 "$go" build -trimpath -o "$tmp/imagebuild" .)
	(cd "$mod" && CGO_ENABLED=0 "$go" build -trimpath -ldflags "-s -w" -o "$tmp/echo-basic" sigs.k8s.io/gateway-api/conformance/echo-basic)
	for n in "${names[@]}"; do
		"$tmp/imagebuild" --name "$n" --out "$dir/echo-basic-$version-${n##*:}.tar" \
			--file "$tmp/echo-basic:/echo-basic:0755" --entrypoint /echo-basic
	done
	echo "gateway-conformance: echo-basic $version built in $(($(date +%s) - t0)) s as ${names[*]}" >&2
fi
for n in "${names[@]}"; do
	echo "$dir/echo-basic-$version-${n##*:}.tar"
done

coredns_ref=$(grep -rhoE 'registry\.k8s\.io/coredns/coredns:v[0-9.]+' "$src/base" | sort -u | head -n 1)
coredns_version=${coredns_ref##*:}
coredns=$dir/gwconf-coredns-$coredns_version.tar
if [[ ! -s $coredns ]]; then
	t0=$(date +%s)
	[[ -x $tmp/imagebuild ]] || (cd "$repo/scripts/node/images" && CGO_ENABLED=0 "$go" build -trimpath -o "$tmp/imagebuild" .)
	GOBIN=$tmp/bin CGO_ENABLED=0 "$go" install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns_version"
	"$tmp/imagebuild" --name "$coredns_ref" --out "$coredns" --file "$tmp/bin/coredns:/coredns:0755" --entrypoint /coredns
	echo "gateway-conformance: coredns $coredns_version built in $(($(date +%s) - t0)) s" >&2
fi
echo "$coredns"
