#!/usr/bin/env bash
# Build (once) and cache the root filesystem of the steelyard image: the
# Dockerfile's runtime stage, Debian bookworm (minbase) with iptables, ipset,
# ipvsadm, conntrack, iproute2, nftables, nginx-light and bpftool, made by debootstrap from the
# machine's Debian mirror (no registry, no base image download).
#
#   scripts/node/rootfs.sh           build if needed, print the rootfs tarball
#   scripts/node/rootfs.sh --force   rebuild even if the cache is good
#
# Cached under $STEELYARD_CACHE (default $HOME/.cache/steelyard) as
# rootfs-bookworm-<key>.tar, where the key hashes the suite, the package
# list and this script, so a change to either builds a new one. Progress
# goes to stderr; stdout carries only the tarball's path.
# ROOTFS_PACKAGES replaces the package list (scripts/conformance/images.sh
# builds the e2e suite's agnhost userland with it).
set -euo pipefail

suite=${ROOTFS_SUITE:-bookworm}
mirror=${ROOTFS_MIRROR:-http://deb.debian.org/debian}
packages=${ROOTFS_PACKAGES:-iptables,ipset,ipvsadm,conntrack,iproute2,nftables,nginx-light,bpftool}
cache=${STEELYARD_CACHE:-$HOME/.cache/steelyard}
# shellcheck source=../lib/lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/lock.sh"
cache_lock rootfs
key=$( (echo "$suite $packages"; cat "${BASH_SOURCE[0]}") | sha256sum | cut -c1-12)
out=$cache/rootfs-$suite-$key.tar

force=false
for arg in "$@"; do
	case $arg in
	--force) force=true ;;
	-h | --help)
		sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "rootfs.sh: unknown argument $arg (try --help)" >&2
		exit 2
		;;
	esac
done

if ! $force && [[ -s $out ]]; then
	echo "rootfs: cached in $out" >&2
	echo "$out"
	exit 0
fi
if [[ $(id -u) != 0 ]]; then
	echo "rootfs: debootstrap needs root" >&2
	exit 1
fi
command -v debootstrap >/dev/null || { echo "rootfs: debootstrap missing (scripts/install-deps.sh)" >&2; exit 1; }

echo "rootfs: debootstrap $suite (minbase + $packages) from $mirror" >&2
start=$(date +%s)
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.rootfs-$suite.XXXXXX")
cleanup() {
	# debootstrap mounts proc/sys in the target while it runs; never leave
	# them behind when it fails half-way.
	local m
	for m in $(awk -v d="$tmp/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
		umount -l "$m" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$tmp/root" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
	tail -n 30 "$tmp/debootstrap.log" >&2
	exit 1
}
# What the Dockerfile's `rm -rf /var/lib/apt/lists/*` does, plus caches
# debootstrap leaves.
rm -rf "$tmp/root/var/lib/apt/lists/"* "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/debootstrap"
# Deterministic-ish: numeric owners, sorted names.
tar --numeric-owner --sort=name -C "$tmp/root" -cf "$tmp/rootfs.tar" .
mv "$tmp/rootfs.tar" "$out"
echo "rootfs: built in $(($(date +%s) - start)) s ($(du -h "$out" | cut -f1))" >&2
echo "$out"
