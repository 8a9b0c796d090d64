#!/usr/bin/env bash
# Memory and CPU of the cluster `make cluster-up` started (and of nothing
# else on the machine): the processes of `steelyard-cluster up` and its
# descendants (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelets, containerds) plus every process in the
# cluster's cgroup tree (shims, pods, the steelyard agents). RSS is summed
# per program name; CPU is the share of one core each used over the sample.
#
#   scripts/node/cluster-usage.sh [SECONDS]   sample CPU over SECONDS (default 60)
#
# Needs root (reads /proc of every process). Prints a table and the load
# averages before and after the sample.
set -euo pipefail

state=${STATE:-/tmp/steelyard-cluster}
secs=${1:-60}
pid=$(cat "$state/pid" 2>/dev/null) || {
	echo "cluster-usage: no $state/pid (make cluster-up first)" >&2
	exit 1
}
kill -0 "$pid" 2>/dev/null || {
	echo "cluster-usage: steelyard-cluster $pid is not running" >&2
	exit 1
}

# The cluster's processes: pid's descendants, and the cgroup tree named
# steelyard-node-<pid>-* (in the memory hierarchy, or the unified one).
procs() {
	local todo=("$pid") p kids seen=" "
	while ((${#todo[@]})); do
		p=${todo[0]}
		todo=("${todo[@]:1}")
		[[ $seen == *" $p "* ]] && continue
		seen+="$p "
		echo "$p"
		kids=$(cat /proc/"$p"/task/*/children 2>/dev/null || true)
		for k in $kids; do todo+=("$k"); done
	done
	local h
	for h in /sys/fs/cgroup/memory /sys/fs/cgroup/unified /sys/fs/cgroup; do
		if compgen -G "$h/steelyard-node-$pid-*" >/dev/null; then
			find "$h"/steelyard-node-"$pid"-* -name cgroup.procs -exec cat {} + 2>/dev/null
			break
		fi
	done
}

# name rss_kib ticks, per process.
snapshot() {
	local p
	for p in $(procs | sort -un); do
		[[ -r /proc/$p/stat ]] || continue
		awk -v p="$p" '
			FNR == 1 && FILENAME ~ /stat$/ {
				s = $0; sub(/^[^(]*\(/, "", s); name = s; sub(/\).*$/, "", name)
				sub(/^[^)]*\) /, "", s); split(s, f, " "); ticks = f[12] + f[13]
			}
			FILENAME ~ /status$/ && $1 == "VmRSS:" { rss = $2 }
			END { if (name != "") printf "%s %s %d %d\n", p, name, rss, ticks }
		' /proc/"$p"/stat /proc/"$p"/status 2>/dev/null || true
	done
}

hz=$(getconf CLK_TCK)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
before=$(snapshot)
sleep "$secs"
after=$(snapshot)
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
join <(sort -k1,1 <<<"$before") <(sort -k1,1 <<<"$after") |
	awk -v hz="$hz" -v secs="$secs" '
		{ name = $5; n[name]++; rss[name] += $6; cpu[name] += ($7 - $4) / hz / secs * 100
		  trss += $6; tcpu += ($7 - $4) / hz / secs * 100 }
		END {
			printf "%-26s %5s %9s %7s\n", "program", "procs", "RSS MiB", "CPU %"
			for (k in n) printf "%-26s %5d %9.1f %7.1f\n", k, n[k], rss[k] / 1024, cpu[k] | "sort -k3 -nr"
			close("sort -k3 -nr")
			printf "%-26s %5s %9.1f %7.1f\n", "total", "", trss / 1024, tcpu
		}'
