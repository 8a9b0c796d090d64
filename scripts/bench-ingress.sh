#!/usr/bin/env bash
# The L7 benchmark (test/bench/ingress): constant-rate HTTP load through
# nginx, steady then with endpoint churn 5 -> 7 -> 5, for VIP upstreams
# (steelyard's design, no reload on endpoint changes) and pod upstreams
# (--ingress-upstreams=pods, a reload per change). Runs in network
# namespaces it makes and deletes; never touches the machine's own network
# namespace. Prints one table; asserts nothing. Needs root, bin/steelyard
# (`make build`), nginx (`make deps`) and the control-plane binaries
# (`make control-plane`).
#
#   RATE=500        requests per second (open loop, latency from due time)
#   DURATION=60     seconds per phase (steady, then churn): 120 s per mode
#   PERIOD=10       seconds between endpoint changes during churn
#   MODES=vip,pods  upstream modes
#
# Columns: requests, errors (timeouts included), timeouts, nginx reloads
# during the phase, latency percentiles over every request (measured from
# its due time), slow requests (>= 50 ms) and, in brackets, how many of them
# were due within 1 s after an endpoint change (is a tail caused by the
# churn or by the machine?), and the machine's load average.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-500}
DURATION=${DURATION:-60}
PERIOD=${PERIOD:-10}
MODES=${MODES:-vip,pods}
GO=${GO:-go}
mkdir -p bin
"$GO" build -o bin/ingress-bench ./test/bench/ingress
exec bin/ingress-bench -steelyard bin/steelyard -rate "$RATE" -duration "${DURATION}s" -period "${PERIOD}s" -modes "$MODES"
