#!/usr/bin/env bash
# Installs what the IPVS VM harness needs on a Debian/Ubuntu host: qemu,
# Debian's cloud kernel (IPVS as modules), busybox-static for the guest's
# userland, ipvsadm, ipset, iptables, nft, conntrack and bpftool (copied
# into the guest with their libraries), kmod (depmod) and cpio. The host's running kernel is not
# touched: the cloud kernel is only booted inside qemu. Runs as root when
# something is missing; scripts/install-deps.sh does the installing.
set -euo pipefail

need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
compgen -G '/boot/vmlinuz-*-cloud-amd64' >/dev/null || need+=(linux-image-cloud-amd64)
[ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || need+=(busybox-static)
command -v ipvsadm >/dev/null 2>&1 || [ -x /usr/sbin/ipvsadm ] || need+=(ipvsadm)
command -v ipset >/dev/null 2>&1 || [ -x /usr/sbin/ipset ] || need+=(ipset)
[ -x /usr/sbin/xtables-legacy-multi ] || need+=(iptables)
command -v depmod >/dev/null 2>&1 || [ -x /usr/sbin/depmod ] || need+=(kmod)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
[ -x /usr/sbin/nft ] || need+=(nftables)
# The ebpf rows of test/e2e in the guest (scripts/vm/test-ebpf.sh).
[ -x /usr/sbin/conntrack ] || need+=(conntrack)
[ -x /usr/sbin/bpftool ] || need+=(bpftool)
command -v file >/dev/null 2>&1 || need+=(file)

# The apt logic (root check, apt-get update/install) is scripts/install-deps.sh's.
exec "$(dirname "$0")/../install-deps.sh" --packages "${need[@]}"
