#!/usr/bin/env bash
# Growth table of the dataplanes: first sync, one-endpoint partial sync,
# full resync, explain, listing the ruleset and peak RSS at 1k/10k/30k
# Services x 10 endpoints. Each point runs in its own throwaway network
# namespace (never the root one), removed at the end, also on failure.
# Prints the table and draws docs/bench-scale.svg, with the points of
# `make bench-k8s` (docs/bench-k8s.jsonl: steelyard and kube-proxy nftables
# against a real API server) beside them. Asserts nothing.
#
#   SIZES="1000 10000 30000"      Services per point
#   LEGACY_SIZES="1000 10000"     sizes for iptables-legacy ("" to skip)
#   LIMIT=1200                    seconds a point may take before it is dropped
#   OUT=docs/bench-scale.svg
#   K8S_POINTS=docs/bench-k8s.jsonl  drawn too, if the file exists
#   PLOT_ONLY=1                   measure nothing: redraw from the points in
#                                 ${OUT%.*}.jsonl and K8S_POINTS
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-1000 10000 30000}
LEGACY_SIZES=${LEGACY_SIZES-1000 10000}
LIMIT=${LIMIT:-1200}
OUT=${OUT:-docs/bench-scale.svg}
K8S_POINTS=${K8S_POINTS:-docs/bench-k8s.jsonl}
ns="syscale$$"
go build -o bin/scale-plot ./test/bench/scale/plot
k8s_points=()
[ -f "$K8S_POINTS" ] && k8s_points=("$K8S_POINTS")
if [ -n "${PLOT_ONLY:-}" ]; then
	cat "${OUT%.*}.jsonl" "${k8s_points[@]}" | bin/scale-plot -o "$OUT"
	exit 0
fi
go build -o bin/scale-bench ./test/bench/scale
results=$(mktemp)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -f "$results"' EXIT INT TERM
point() {
	ip netns add "$ns"
	if ! timeout "$LIMIT" ip netns exec "$ns" bin/scale-bench -dataplane "$1" -services "$2" >>"$results"; then
		echo "$1 at $2 Services: did not finish within ${LIMIT}s" >&2
	fi
	ip netns del "$ns"
}
for n in $SIZES; do point nftables "$n"; done
if command -v iptables-legacy >/dev/null; then
	for n in $LEGACY_SIZES; do point iptables-legacy "$n"; done
fi
echo "load average during the run: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$results" "${k8s_points[@]}" | bin/scale-plot -o "$OUT"
cp "$results" "${OUT%.*}.jsonl"
echo "points: ${OUT%.*}.jsonl; \`make docs\` renders the README's and docs/' tables from them"
