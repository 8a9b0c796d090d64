#!/usr/bin/env bash
# Build (or reuse) the two images the conformance run adds to the node
# (docker-archive tarballs for `ctr images import`, no registry):
#
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1   agnhost as upstream ships
#       it: the binary (k8s.io/kubernetes/test/images/agnhost, the same
#       module as scripts/node/images.sh) on a userland, because the tests
#       exec `/bin/sh -c "... nc ... curl ..."` in it. Upstream's is Alpine
#       with bind-tools curl netcat-openbsd iproute2 bash util-linux socat
#       (and busybox's wget, which the tests also call);
#       this one is Debian bookworm (scripts/node/rootfs.sh) with the same.
#       Imported after the node's bare agnhost, it replaces it. Its
#       /var/registry holds the node's pause image as pause:testing for
#       fake-registry-server ("LocalhostNodePorts should let a node pull an
#       image from a registry exposed via localhost NodePort").
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-2   the same userland
#       alone (a few Service tests run their client in busybox: sh, env).
#   registry.k8s.io/coredns/coredns:steelyard-conformance   CoreDNS (the
#       version scripts/conformance/coredns/go.mod requires) as kube-dns.
#   registry.k8s.io/e2e-test-images/regression-issue-74839:1.5   the
#       "invalid conntrack state" spec's server (k8s.io/kubernetes/test/
#       images/regression-issue-74839, from the agnhost module): the binary
#       alone, as its entrypoint.
#   registry.k8s.io/build-image/distroless-iptables:v0.9.9   the userland
#       again (sh, cat, grep, conntrack, sleep): "KubeProxy should set TCP
#       CLOSE_WAIT timeout" reads the node's conntrack table from it.
#
#   scripts/conformance/images.sh   build what is missing, print the dir
#
# Cached under $STEELYARD_CACHE/images with keys in the names. Progress goes
# to stderr; stdout carries only the directory (agnhost-e2e.tar,
# busybox.tar, coredns.tar, regression-74839.tar, distroless-iptables.tar).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node=$here/../node
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock conformance-images
dir=$cache/images
go=${GO:-go}
agnhost_ref=registry.k8s.io/e2e-test-images/agnhost:2.66.1 # = scripts/node/images.sh
coredns_ref=registry.k8s.io/coredns/coredns:steelyard-conformance
busybox_ref=registry.k8s.io/e2e-test-images/busybox:1.37.0-2 # e2e.test --list-images
regression_ref=registry.k8s.io/e2e-test-images/regression-issue-74839:1.5 # e2e.test --list-images
iptables_ref=registry.k8s.io/build-image/distroless-iptables:v0.9.9 # e2e.test --list-images
userland=bash,curl,wget,netcat-openbsd,iproute2,socat,util-linux,dnsutils,iputils-ping,iptables,conntrack
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export CGO_ENABLED=0

(cd "$node/images" && "$go" build -trimpath -o "$tmp/imagebuild" .)

rootfs=$(ROOTFS_PACKAGES=$userland "$node/rootfs.sh")
# The node's pause image, which agnhost's fake-registry-server serves as
# pause:testing from /var/registry, as upstream's agnhost image does.
pause=$(readlink -f "$("$node/images.sh")/pause.tar")
key=$( (basename "$rootfs"; echo "$agnhost_ref porter-certs registry"; basename "$pause"; cat "$node/agnhost/go.mod") | sha256sum | cut -c1-12)
agnhost=$dir/agnhost-e2e-$key.tar
if [[ ! -s $agnhost ]]; then
	t0=$SECONDS
	(cd "$node/agnhost" && "$go" build -trimpath -ldflags "-s -w" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost)
	# porter's TLS ports read localhost.crt/.key from the working
	# directory (/), as upstream's Dockerfile adds them.
	src=$(cd "$node/agnhost" && "$go" list -mod=readonly -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost/porter)
	"$tmp/imagebuild" --name "$agnhost_ref" --out "$agnhost" --layer "$rootfs" \
		--file "$tmp/agnhost:/agnhost:0755" --file "$src/localhost.crt:/localhost.crt:0644" \
		--file "$src/localhost.key:/localhost.key:0644" --registry "$pause:pause:testing" --entrypoint /agnhost --cmd pause
	find "$dir" -maxdepth 1 -name 'agnhost-e2e-*.tar' -mmin +720 -delete # older keys are garbage; by age, so a concurrent checkout keeps its own
	echo "conformance images: agnhost with a userland built in $((SECONDS - t0)) s" >&2
fi

busybox=$dir/busybox-e2e-$(basename "$rootfs" .tar | sed 's/^rootfs-//').tar
if [[ ! -s $busybox ]]; then
	"$tmp/imagebuild" --name "$busybox_ref" --out "$busybox" --layer "$rootfs" --cmd sh
	find "$dir" -maxdepth 1 -name 'busybox-e2e-*.tar' -mmin +720 -delete # by age: a concurrent checkout keeps its own
	echo "conformance images: busybox (the userland) built" >&2
fi

distroless=$dir/distroless-iptables-e2e-$(basename "$rootfs" .tar | sed 's/^rootfs-//').tar
if [[ ! -s $distroless ]]; then
	"$tmp/imagebuild" --name "$iptables_ref" --out "$distroless" --layer "$rootfs" --cmd sh
	find "$dir" -maxdepth 1 -name 'distroless-iptables-e2e-*.tar' -mmin +720 -delete # by age: a concurrent checkout keeps its own
	echo "conformance images: distroless-iptables (the userland) built" >&2
fi

key=$( (echo "$regression_ref"; cat "$node/agnhost/go.mod") | sha256sum | cut -c1-12)
regression=$dir/regression-74839-$key.tar
if [[ ! -s $regression ]]; then
	(cd "$node/agnhost" && "$go" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/regression-issue-74839" k8s.io/kubernetes/test/images/regression-issue-74839)
	"$tmp/imagebuild" --name "$regression_ref" --out "$regression" \
		--file "$tmp/regression-issue-74839:/regression-issue-74839:0755" --entrypoint /regression-issue-74839
	echo "conformance images: regression-issue-74839 built" >&2
fi

version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' "$here/coredns/go.mod")
key=$( (echo "$version"; cat "$here/coredns/main.go" "$here/coredns/go.sum"; "$go" version) | sha256sum | cut -c1-12)
coredns=$dir/coredns-$version-$key.tar
if [[ ! -s $coredns ]]; then
	t0=$SECONDS
	(cd "$here/coredns" && "$go" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/coredns" .)
	"$tmp/imagebuild" --name "$coredns_ref" --out "$coredns" \
		--file "$tmp/coredns:/coredns:0755" --entrypoint /coredns
	echo "conformance images: coredns $version built in $((SECONDS - t0)) s" >&2
fi
# The set, in this checkout (as scripts/node/images.sh does).
set_dir=$(cd "$here/../.." && pwd)/bin/conformance-images
mkdir -p "$set_dir"
ln -sfn "$agnhost" "$set_dir/agnhost-e2e.tar"
ln -sfn "$coredns" "$set_dir/coredns.tar"
ln -sfn "$busybox" "$set_dir/busybox.tar"
ln -sfn "$distroless" "$set_dir/distroless-iptables.tar"
ln -sfn "$regression" "$set_dir/regression-74839.tar"
echo "$set_dir"
