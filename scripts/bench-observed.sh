#!/usr/bin/env bash
# The cost of counting new connections per endpoint (issue 23): the scale
# benchmark (test/bench/scale) at SERVICES x 10 endpoints with counting off
# and on, in one run, for each of DATAPLANES; each point in its own
# throwaway network namespace (never the root one), removed at the end,
# also on failure. Appends the points to OUT (`make docs` renders the
# table in docs/benchmarks.md from the last point of each dataplane, size
# and counting state). Asserts nothing. IPVS counts always (its
# statistics), so it has no "off" to compare; the iptables rules count
# always too (each DNAT rule's own counter), so there "on" only adds the
# timed read of every count.
#
#   SERVICES=10000  DATAPLANES="nftables iptables-legacy iptables-nft"  LIMIT=1500
#   COUNTING="false true"  (one of them: half a pair, to run the halves
#   side by side; append the off point before the on point)
#   OUT=docs/bench-observed.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
SERVICES=${SERVICES:-10000}
DATAPLANES=${DATAPLANES:-nftables iptables-legacy iptables-nft}
LIMIT=${LIMIT:-1500}
COUNTING=${COUNTING:-false true}
OUT=${OUT:-docs/bench-observed.jsonl}
ns="syobs$$"
go build -o bin/scale-bench ./test/bench/scale
results=$(mktemp)
trap 'ip netns del "$ns" 2>/dev/null || true; rm -f "$results"' EXIT INT TERM
for dp in $DATAPLANES; do
	for count in $COUNTING; do
		ip netns add "$ns"
		if ! timeout "$LIMIT" ip netns exec "$ns" bin/scale-bench -dataplane "$dp" -services "$SERVICES" -count-connections="$count" >>"$results"; then
			echo "$dp at $SERVICES Services (counting $count): did not finish within ${LIMIT}s" >&2
		fi
		ip netns del "$ns"
	done
done
cat "$results" >>"$OUT"
echo "points: $OUT; \`make docs\` renders the table of docs/benchmarks.md from them"
