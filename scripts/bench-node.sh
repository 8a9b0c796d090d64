#!/usr/bin/env bash
# The seed's dynamic test on a real node (test/bench/node): steelyard from
# manifests/ with --ingress, constant-rate HTTP load through nginx to a
# Deployment of agnhost netexec pods, steady and scaled 5 <-> 7 every
# 10-12 s, with VIP upstreams and with --ingress-upstreams=pods. Writes
# docs/bench-node.json, prints the table and draws docs/bench-node.svg
# (test/bench/node/plot). Asserts nothing. Needs root and the node's
# environment (make bench-node sets it: containerd, CNI plugins, images).
#
#   RATE=0          requests per second; 0: the probe picks the highest
#                   rate of PROBE the machine sustains
#   PROBE=500,1000,2000,3000,4000 (a step saturates on an error, a p99 over
#                   100 ms or a sender 50 ms behind)
#   DURATION=120    seconds per run (four runs)
#   MODES=vip,pods  upstream modes (--ingress-upstreams)
#   PHASES=steady,churn  runs per mode; "bystander" adds the control: the
#                   backends steady while a Deployment behind no Service
#                   scales 5 <-> 7 on the same node (OUT elsewhere, e.g.
#                   MODES=vip PHASES=steady,churn,bystander OUT=/tmp/control);
#                   "frozen" the other control: the churn with steelyard's
#                   agent stopped (SIGSTOP) once its rules hold the 5
#                   backends, nginx still serving, so the tail is the
#                   node's (test/bench/node/frozen.go); with it every run
#                   goes without the DaemonSet's liveness probe
#   OUT=docs/bench-node   report and picture (.json, .svg)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-0}
PROBE=${PROBE:-500,1000,2000,3000,4000}
DURATION=${DURATION:-120}
MODES=${MODES:-vip,pods}
PHASES=${PHASES:-steady,churn}
OUT=${OUT:-docs/bench-node}
GO=${GO:-go}
mkdir -p bin
"$GO" build -o bin/node-bench ./test/bench/node
"$GO" build -o bin/node-plot ./test/bench/node/plot
bin/node-bench -rate "$RATE" -probe "$PROBE" -duration "${DURATION}s" -modes "$MODES" -phases "$PHASES" -o "$OUT.json"
bin/node-plot -o "$OUT.svg" <"$OUT.json"
echo "report: $OUT.json; \`make docs\` renders the README's and docs/' tables from it"
