#!/usr/bin/env bash
# Boots Debian's cloud kernel (IPVS as modules) under qemu with a small
# initramfs and runs one command in it; prints the guest's console and exits
# with the command's exit status. steelyard's IPVS tests run this way because
# the host kernel may have no IPVS; nothing on the host is changed.
#
#   scripts/vm/run.sh [--timeout SECONDS] [--add HOST_PATH:GUEST_PATH]... -- COMMAND [ARGS...]
#
# The guest has busybox, iproute2's ip, ipvsadm, ipset, iptables and
# ip6tables (legacy), nft, conntrack, bpftool, cgroup2 on /sys/fs/cgroup,
# a bpffs on /sys/fs/bpf, the IPVS, conntrack, NAT (both families), ipset,
# nf_tables, SCTP (sctp, xt_sctp), veth and dummy modules (loaded at boot;
# IPv6 itself is built into the kernel),
# and every --add file. COMMAND runs as root in /work with PATH set; /tmp is
# a tmpfs. The base initramfs (kernel, modules, tools) is built once and
# cached under $HOME/.cache/steelyard/vm-<kernel version>; the added files go
# into a second archive per run, so a run costs only the boot (about 10 s
# under TCG). KVM is used only where the CPU shows vmx or svm.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
timeout=300
adds=()
while [ $# -gt 0 ]; do
	case "$1" in
	--timeout) timeout=$2; shift 2 ;;
	--add) adds+=("$2"); shift 2 ;;
	--) shift; break ;;
	*) echo "vm: unknown option $1" >&2; exit 2 ;;
	esac
done
if [ $# -eq 0 ]; then
	echo "usage: $0 [--timeout S] [--add HOST:GUEST]... -- COMMAND [ARGS...]" >&2
	exit 2
fi

"$here/install-deps.sh"

kernel=$(ls /boot/vmlinuz-*-cloud-amd64 2>/dev/null | sort -V | tail -1)
if [ -z "$kernel" ]; then
	echo "vm: no /boot/vmlinuz-*-cloud-amd64 (linux-image-cloud-amd64 not installed?)" >&2
	exit 1
fi
kver=${kernel#/boot/vmlinuz-}
# The cache key covers the kernel and this script's recipe.
recipe=$(sha256sum "$0" | cut -c1-12)
cache=${HOME}/.cache/steelyard/vm-${kver}-${recipe}
base=$cache/base.cpio.gz

modules=(ip_vs ip_vs_rr ip_vs_wrr ip_vs_lc ip_vs_wlc ip_vs_sh ip_vs_mh nf_conntrack nf_nat
	veth dummy ip_set ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet xt_set
	x_tables ip_tables iptable_nat iptable_filter xt_MASQUERADE xt_mark xt_comment xt_conntrack
	xt_addrtype xt_nat nf_conntrack_netlink ip6_tables ip6table_nat ip6table_filter crc32c-intel
	nf_tables nft_chain_nat nft_ct nft_nat nft_masq nft_numgen nft_reject nft_reject_inet
	nft_reject_ipv4 nft_reject_ipv6 nft_fib nft_fib_inet nft_fib_ipv4 nft_fib_ipv6 nft_objref
	sctp xt_sctp xt_statistic xt_recent xt_tcpudp ipt_REJECT ip6t_REJECT)
# The iptables mode (test/ipvs/sctp_test.go) also needs -m statistic,
# -m recent, -m tcp/udp and REJECT.
# SCTP: sockets (sctp) and iptables' -m sctp (xt_sctp); conntrack, NAT and
# IPVS carry SCTP built in on Debian's 6.1 (NF_CT_PROTO_SCTP=y,
# IP_VS_PROTO_SCTP=y), and nft's "sctp dport" is a payload match of
# nf_tables itself. The host kernel never loads any of these.
# setpriv: test/ipvs/capabilities_test.go runs the agent with a bounding set.
# nft: test/ipvs/nftables_stale_test.go (the nftables mode on a 6.1 kernel).
# conntrack, bpftool: the ebpf rows of test/e2e (scripts/vm/test-ebpf.sh)
# look for the VIP in conntrack and list the programs of their cgroup.
tools=(/usr/sbin/ipvsadm /usr/sbin/ipset /usr/sbin/xtables-legacy-multi /usr/bin/ip /sbin/ip /bin/ip /usr/bin/setpriv /usr/sbin/nft
	/usr/sbin/conntrack /usr/sbin/bpftool)

build_base() {
	local root
	root=$(mktemp -d)
	trap 'rm -rf "$root"' RETURN
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc,work,lib/modules/"$kver"}
	cp /bin/busybox "$root/bin/busybox"
	ln -s busybox "$root/bin/sh"
	# Modules and their dependencies, from modules.dep.
	local mdir=/lib/modules/$kver want=() m line
	for m in "${modules[@]}"; do
		line=$(grep -E "/${m//[_-]/[_-]}\.ko(\.[a-z]+)?:" "$mdir/modules.dep" | head -1)
		if [ -z "$line" ]; then
			echo "vm: module $m not found in $mdir" >&2
			return 1
		fi
		want+=(${line//:/})
	done
	for m in $(printf '%s\n' "${want[@]}" | sort -u); do
		mkdir -p "$root/lib/modules/$kver/$(dirname "$m")"
		cp "$mdir/$m" "$root/lib/modules/$kver/$m"
	done
	cp "$mdir"/modules.{order,builtin,builtin.modinfo} "$root/lib/modules/$kver/" 2>/dev/null || true
	depmod -b "$root" "$kver"
	# Tools with their shared libraries and the loader.
	local t lib
	for t in "${tools[@]}"; do
		[ -x "$t" ] || continue
		[ -e "$root$t" ] && continue
		mkdir -p "$root$(dirname "$t")"
		cp -L "$t" "$root$t"
		for lib in $(ldd "$t" | grep -oE '/[^ ]+'); do
			mkdir -p "$root$(dirname "$lib")"
			cp -Ln "$lib" "$root$lib"
		done
	done
	if [ ! -x "$root/usr/bin/ip" ] && [ ! -x "$root/sbin/ip" ] && [ ! -x "$root/bin/ip" ]; then
		echo "vm: iproute2's ip not found" >&2
		return 1
	fi
	# iptables extensions (libxt_*.so) are loaded at run time.
	local xt
	xt=$(dirname "$(ls /usr/lib/*/xtables/libxt_comment.so | head -1)")
	mkdir -p "$root$xt"
	cp -L "$xt"/*.so "$root$xt/"
	# ... with their own libraries (libxt_statistic.so needs libm, which
	# no tool above pulls in; the iptables mode's restores load it).
	for lib in $(ldd "$xt"/*.so 2>/dev/null | grep -v ':$' | grep -oE '/[^ ]+' | sort -u); do
		[ -e "$root$lib" ] && continue
		mkdir -p "$root$(dirname "$lib")"
		cp -Ln "$lib" "$root$lib"
	done
	for n in iptables iptables-save iptables-restore iptables-legacy iptables-legacy-save iptables-legacy-restore \
		ip6tables ip6tables-save ip6tables-restore ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore; do
		ln -s xtables-legacy-multi "$root/usr/sbin/$n"
	done
	# ipset resolves "tcp" and "sctp" in its members through /etc/protocols.
	if [ -r /etc/protocols ]; then
		cp /etc/protocols "$root/etc/protocols"
	else
		printf 'ip 0 IP\nicmp 1 ICMP\ntcp 6 TCP\nudp 17 UDP\nsctp 132 SCTP\n' >"$root/etc/protocols"
	fi
	echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
	echo 'root:x:0:' >"$root/etc/group"
	printf '%s\n' "${modules[@]}" >"$root/etc/modules"
	cat >"$root/init" <<'INIT'
#!/bin/busybox sh
# busybox applets last on PATH: the real ip, iptables and modprobe win.
mkdir -p /busybox
/bin/busybox --install -s /busybox
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/busybox
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The ebpf mode: cgroup v2 as the only hierarchy (its socket programs
# attach to a sub-cgroup the suite makes) and a bpffs for the pins.
mount -t cgroup2 none /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
ip link set lo up
for m in $(cat /etc/modules); do
	modprobe "$m" || echo "vm: modprobe $m failed"
done
echo "vm: booted in $(cut -d' ' -f1 /proc/uptime) s"
cd /work
if [ -x /work/run ]; then
	/work/run
	rc=$?
else
	echo "vm: no /work/run"
	rc=125
fi
echo "STEELYARD-VM-EXIT=$rc"
sync
poweroff -f
INIT
	chmod +x "$root/init"
	# Earlier recipes of this kernel are stale now.
	find "$(dirname "$cache")" -maxdepth 1 -name "vm-${kver}-*" ! -path "$cache" -exec rm -rf {} + 2>/dev/null || true
	mkdir -p "$cache"
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$base.tmp"
	mv "$base.tmp" "$base"
	cp "$kernel" "$cache/vmlinuz"
	echo "vm: built $base ($(du -h "$base" | cut -f1))" >&2
}

# One builder at a time (scripts/lib/lock.sh), held only while building:
# the VMs themselves run side by side.
(
	# shellcheck source=../lib/lock.sh
	. "$here/../lib/lock.sh"
	cache_lock vm
	if [ ! -s "$base" ] || [ ! -s "$cache/vmlinuz" ]; then
		build_base
	fi
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/work"
for a in "${adds[@]}"; do
	src=${a%%:*}
	dst=${a#*:}
	mkdir -p "$work/root$(dirname "$dst")"
	cp -L "$src" "$work/root$dst"
done
{
	echo '#!/bin/sh'
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$work/root/work/run"
# busybox sh has no $'...' quoting from printf %q; keep arguments simple.
chmod +x "$work/root/work/run"
(cd "$work/root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/extra.cpio.gz"
cat "$base" "$work/extra.cpio.gz" >"$work/initrd.gz"

accel=(-accel tcg -cpu max)
if grep -qE '\b(vmx|svm)\b' /proc/cpuinfo && [ -w /dev/kvm ]; then
	accel=(-accel kvm -cpu host)
fi
start=$(date +%s.%N)
set +e
timeout --foreground -k 5 "$timeout" qemu-system-x86_64 "${accel[@]}" -m 1024M -smp 2 \
	-nographic -nodefaults -serial stdio -no-reboot \
	-kernel "$cache/vmlinuz" -initrd "$work/initrd.gz" \
	-append "console=ttyS0 rdinit=/init panic=-1 quiet" </dev/null |
	sed -u -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r$//' | tee "$work/console.log"
qrc=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
rc=$(grep -ao 'STEELYARD-VM-EXIT=[0-9]*' "$work/console.log" | tail -1 | cut -d= -f2 || true)
echo "vm: qemu exited $qrc after $(echo "$end - $start" | bc 2>/dev/null || awk "BEGIN{print $end-$start}") s" >&2
if [ -z "$rc" ]; then
	echo "vm: the guest did not report an exit status (qemu status $qrc; 124 = timeout after ${timeout}s)" >&2
	exit 1
fi
exit "$rc"
