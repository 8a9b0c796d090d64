#!/usr/bin/env bash
# Compares steelyard (iptables, nftables and ebpf modes) with kube-proxy
# v1.37.2 (iptables and nftables modes) against a real kube-apiserver loaded
# with N Services x M endpoints (test/bench/k8s). Each proxy runs in a network namespace the benchmark
# makes and deletes (also on failure or Ctrl-C); the machine's own network
# namespace is never touched. Prints one table; asserts nothing. Needs root,
# bin/steelyard (`make build`) and the control-plane binaries
# (`make control-plane`).
#
#   SERVICES=1000,10000,30000,1000x100
#                            sizes, one control plane each: a Service count,
#                            with its endpoints per Service after an x (else 10)
#   IPTABLES_MODE=legacy     iptables flavours for steelyard and kube-proxy
#   NFT_MAX_SERVICES=1000    the nft flavour only up to this size
#                            (iptables-nft-restore slows down with jumps x
#                            chains: 10,000 Services would take many minutes
#                            per restore); 0 for no limit
#   PROXIES=steelyard,kube-proxy-iptables,steelyard-nftables,steelyard-ebpf,kube-proxy-nftables,kube-proxy-nftables-msp250ms
#                            a -msp<duration> suffix runs the proxy with that
#                            --min-sync-period (steelyard's default is 250ms,
#                            kube-proxy's 1s); the iptables modes run up to
#                            -iptables-max-services (1000) only
#   CHANGES=60               endpoint changes per proxy
#   CHANGE_GAP=1s            random pause before each change, uniform in [0, this)
#   IDLE=15s                 the quiet period after the changes (0s: none)
#   POINTS=docs/bench-k8s.jsonl  each measured proxy is appended here as a
#                            point of the growth figure (make bench draws
#                            them beside the dataplanes; "" for none: then
#                            the run leaves no data and its figures cannot
#                            go into the docs). Each point names its commit,
#                            date and load; `make docs` renders the README's
#                            and docs/' tables from the file.
#   TRAFFIC_SIZES=1000,30000 sizes at which each proxy also runs the traffic
#                            phase (test/bench/k8s/traffic.go: first byte and
#                            requests/s through one Service's VIP vs direct to
#                            a pod), "all", "none" or e.g. 1000,30000
#   BENCH_ARGS=...           more flags for k8s-bench (see k8s-bench -h),
#                            e.g. "-log-dir /tmp/logs -v", "-load api"
#
# The objects are written into etcd as kube-apiserver stores them (-load
# etcd, test/bench/k8s/seed.go): creating them through the API is quadratic
# in v1.37 (its ClusterIP allocator lists every IPAddress after each
# allocation), which kept 30,000 Services out of reach.
#
# Columns (the table's footer repeats this):
#   first full sync  process start to the end of the first sync after which
#                    the kernel holds a DNAT to every endpoint of every
#                    Service. Sync end times come from the proxy's health
#                    endpoint (steelyard /healthz, kube-proxy /livez
#                    status.IPv4.lastUpdated), polled; after each new sync
#                    the rules are read back (iptables-<flavour>-save -t nat,
#                    nft list table ip kube-proxy) and counted.
#   change p50/p99   CHANGES changes, one at a time, after a random pause:
#                    one endpoint of a random Service gets a never-used
#                    address (slice stamped with
#                    endpoints.kubernetes.io/last-change-trigger-time). From
#                    the API write to the end of the first sync after which
#                    that address is in the kernel (same method: the kernel
#                    is watched, not the proxy's histogram). nftables modes:
#                    to the receipt of the kernel's notification that added
#                    the address (NEWRULE or NEWSETELEM, on a netlink socket
#                    of the benchmark's own in the namespace, group
#                    NFNLGRP_NFTABLES; no ruleset load, unlike `nft monitor`,
#                    which was not live within minutes at 10,000 Services).
#                    ebpf mode: to the first poll (1 ms) of the changed
#                    port's entries in the pinned maps that finds it.
#   CPU per change   the proxy's CPU during the changes / changes measured;
#                    total: from start to the end of the quiet period.
#   explain          steelyard explain --mode X in the namespace after the
#                    run, wall and CPU; kube-proxy has no explain: its rules
#                    listed (nft list ruleset, iptables-save) instead.
#   maps memlock     ebpf mode: the kernel's memory of the pinned maps.
#   netprog          the proxy's own network-programming histogram over the
#                    same changes (bucket upper bounds only).
#   partial sync     mean and count of the proxy's partial-sync histogram
#                    during the changes.
#   CPU s            utime+stime of the proxy plus its waited-for children
#                    (cutime+cstime: iptables-restore, nft) plus live
#                    descendants, from /proc (no cgroups): up to the first
#                    full sync / during the changes.
#   peak RSS         the proxy's VmHWM (children not included).
#   quiet period     (under the table) after the changes, -idle (65 s) with
#                    nothing changed: the proxy's syncs (count, mean, slowest
#                    bucket) and, in nftables modes, the kernel transactions
#                    and messages they wrote; also the listener's counts and
#                    ENOBUFS overruns during the changes.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "bench-k8s: needs root (network namespaces, iptables)" >&2
	exit 1
fi
# kube-proxy's nftables mode runs the nft binary.
if ! command -v nft >/dev/null 2>&1; then
	echo "bench-k8s: installing nftables (for kube-proxy --proxy-mode=nftables)" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends nftables >/dev/null
fi
scripts/install-deps.sh

steelyard=${STEELYARD_BIN:-bin/steelyard}
if [ ! -x "$steelyard" ]; then
	echo "bench-k8s: $steelyard missing: run make build" >&2
	exit 1
fi
go build -o bin/k8s-bench ./test/bench/k8s

echo "bench-k8s: load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
exec bin/k8s-bench \
	-steelyard "$steelyard" \
	-services "${SERVICES:-1000,10000,30000,1000x100}" \
	-iptables-mode "${IPTABLES_MODE:-legacy}" \
	-nft-max-services "${NFT_MAX_SERVICES:-1000}" \
	-proxies "${PROXIES:-steelyard,kube-proxy-iptables,steelyard-nftables,steelyard-ebpf,kube-proxy-nftables,kube-proxy-nftables-msp250ms}" \
	-changes "${CHANGES:-60}" \
	-change-gap "${CHANGE_GAP:-1s}" \
	-idle "${IDLE:-15s}" \
	-traffic-sizes "${TRAFFIC_SIZES:-1000,30000}" \
	-points "${POINTS-docs/bench-k8s.jsonl}" \
	${BENCH_ARGS:-}
