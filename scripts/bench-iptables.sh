#!/usr/bin/env bash
# Runs the iptables scale benchmark inside a network namespace made for it
# (never in the root namespace), in both iptables flavours, and removes the
# namespace at the end, also on failure or Ctrl-C. Prints tables; asserts
# nothing.
#
#   SERVICES=10000 ENDPOINTS=10   size for iptables-legacy
#   NFT_SERVICES=2000             size for iptables-nft: its restore grows
#                                 about quadratically with the number of
#                                 chains (10,000 Services take minutes per
#                                 full restore); set 10000 with NFT_QUICK=1
#                                 to measure the first sync and a partial one
set -euo pipefail
cd "$(dirname "$0")/.."
SERVICES=${SERVICES:-10000}
ENDPOINTS=${ENDPOINTS:-10}
NFT_SERVICES=${NFT_SERVICES:-2000}
ns="sybench$$"
go build -o bin/iptables-bench ./test/bench/iptables
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT INT TERM
run() {
	ip netns add "$ns"
	ip netns exec "$ns" bin/iptables-bench -endpoints "$ENDPOINTS" "$@"
	ip netns del "$ns"
	echo
}
run -iptables-mode legacy -services "$SERVICES"
if [ "${NFT_QUICK:-0}" = 1 ]; then
	run -iptables-mode nft -services "$NFT_SERVICES" -quick
else
	run -iptables-mode nft -services "$NFT_SERVICES"
fi
