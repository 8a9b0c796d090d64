#!/usr/bin/env bash
# Installs what steelyard's demo, tests and benchmarks need on a fresh
# Debian/Ubuntu machine: iptables (nft and legacy flavours), conntrack and
# iproute2. Go itself must already be there (see README). Runs as root.
set -euo pipefail

need=()
command -v iptables-nft-restore >/dev/null 2>&1 || need+=(iptables)
command -v iptables-legacy-restore >/dev/null 2>&1 || need+=(iptables)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# curl for make docs-check (the metrics and health endpoints in docs/operations.md).
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need+=(nftables)
# nginx for the L7 Ingress layer (steelyard runs it as its own child, never as a service).
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
# util-linux's flock and setpriv for the e2e suite (the xtables lock chaos
# test, the capability test). Essential on Debian, not on every image.
{ command -v flock && command -v setpriv; } >/dev/null 2>&1 || need+=(util-linux)
# clang, llvm (llvm-strip), libbpf's headers and bpftool for the eBPF mode:
# `make bpf-check` compiles dataplane/ebpf/bpf/ with bpf2go and compares
# the committed objects; bpftool lets an operator read the pinned maps.
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v llvm-strip >/dev/null 2>&1 || need+=(llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
command -v bpftool >/dev/null 2>&1 || [ -x /usr/sbin/bpftool ] || need+=(bpftool)
# `--node`: also what the real node (make node, cluster-up) needs: runc for
# containerd, debootstrap for the steelyard image's root filesystem, and
# util-linux's nsenter/unshare.
if [ "${1:-}" = --node ]; then
	shift
	command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need+=(runc)
	command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
	command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
fi
# `--packages P...`: install exactly P... (if any) with the apt logic below,
# instead of the list above; scripts/vm/install-deps.sh passes its own list.
if [ "${1:-}" = --packages ]; then
	shift
	need=("$@")
fi

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: need root to install: ${need[*]}" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install-deps: please install ${need[*]} with your package manager" >&2
	exit 1
fi
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts the packaged nginx service on install; steelyard only uses the
# binary, so stop and disable a service we just installed.
if [[ " ${need[*]} " == *" nginx-light "* ]] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
	systemctl disable --now nginx >/dev/null 2>&1 || true
fi
