#!/usr/bin/env bash
# The cost of counting new connections per endpoint (issue 23): the scale
# benchmark (test/bench/scale) at SERVICES x 10 endpoints with counting off
# and on, in one run, for nftables and iptables-legacy; each point in its
# own throwaway network namespace (never the root one), removed at the
# end, also on failure. Writes the points to OUT; `make docs` renders the
# table in docs/benchmarks.md from them. Asserts nothing. IPVS counts
# always (its statistics), so it has no "off" to compare.
#
#   SERVICES=10000  DATAPLANES="nftables iptables-legacy"  LIMIT=1500
#   OUT=docs/bench-observed.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
SERVICES=${SERVICES:-10000}
DATAPLANES=${DATAPLANES:-nftables iptables-legacy}
LIMIT=${LIMIT:-1500}
OUT=${OUT:-docs/bench-observed.jsonl}
ns="syobs$$"
go build -o bin/scale-bench ./test/bench/scale
results=$(mktemp)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -f "$results"' EXIT INT TERM
for dp in $DATAPLANES; do
	for count in false true; do
		ip netns add "$ns"
		if ! timeout "$LIMIT" ip netns exec "$ns" bin/scale-bench -dataplane "$dp" -services "$SERVICES" -count-connections="$count" >>"$results"; then
			echo "$dp at $SERVICES Services (counting $count): did not finish within ${LIMIT}s" >&2
		fi
		ip netns del "$ns"
	done
done
cp "$results" "$OUT"
echo "points: $OUT; \`make docs\` renders the table of docs/benchmarks.md from them"
