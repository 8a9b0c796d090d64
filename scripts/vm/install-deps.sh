#!/usr/bin/env bash
# Installs what the IPVS VM harness needs on a Debian/Ubuntu host: qemu,
# Debian's cloud kernel (IPVS as modules), busybox-static for the guest's
# userland, ipvsadm, ipset and iptables (copied into the guest with their
# libraries), kmod (depmod) and cpio. The host's running kernel is not
# touched: the cloud kernel is only booted inside qemu. Runs as root.
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
command -v file >/dev/null 2>&1 || need+=(file)

if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
	echo "vm/install-deps: need root to install: ${need[*]}" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "vm/install-deps: please install ${need[*]} with your package manager" >&2
	exit 1
fi
echo "vm/install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
