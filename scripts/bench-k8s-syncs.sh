#!/usr/bin/env bash
# Summarises the partial syncs in the steelyard logs that `make bench-k8s
# BENCH_ARGS="-log-dir DIR"` keeps: per log, how long the changes waited
# (queued: from the endpoint change's trigger time to the sync's start),
# the build and the whole sync (took), p50 and p99. Where a change's time
# goes when change -> kernel p99 is high.
#
#   scripts/bench-k8s-syncs.sh DIR > docs/bench-k8s-runs/<run>/steelyard-syncs.txt
set -euo pipefail
dir=${1:?usage: $0 LOG-DIR}
for f in "$dir"/steelyard*.log; do
	[ -e "$f" ] || continue
	awk -v name="$(basename "$f")" '
	function ms(v) {
		# Go durations as logged: 1.5ms, 250µs, 2.1s, 1m2.5s.
		if (v ~ /µs$/) { sub(/µs$/, "", v); return v / 1000 }
		if (v ~ /ms$/) { sub(/ms$/, "", v); return v + 0 }
		if (v ~ /ns$/) { sub(/ns$/, "", v); return v / 1e6 }
		m = 0
		if (v ~ /m/) { split(v, a, "m"); m = a[1] * 60000; v = a[2] }
		sub(/s$/, "", v); return m + v * 1000
	}
	function field(k,   r) {
		if (match($0, " " k "=\"?[^ \"]+") == 0) return -1
		r = substr($0, RSTART + length(k) + 2, RLENGTH - length(k) - 2)
		gsub(/"/, "", r); return ms(r)
	}
	function pct(arr, n, p,   i, j, t, idx) {
		for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j+1] = arr[j]; arr[j+1] = t }
		idx = int(p * n + 0.999999); if (idx < 1) idx = 1; return arr[idx]
	}
	/msg="?synced/ && /full=false/ {
		n++; took[n] = field("took"); build[n] = field("build")
		q = field("queued"); if (q >= 0) { nq++; queued[nq] = q }
	}
	END {
		if (n == 0) { printf "%s; partial syncs 0\n", name; exit }
		for (i = 1; i <= n; i++) { t2[i] = took[i]; b2[i] = build[i] }
		for (i = 1; i <= nq; i++) q2[i] = queued[i]
		printf "%s; partial syncs %d; queued p50 %.1f ms p99 %.1f ms; build p50 %.1f ms p99 %.1f ms; took p50 %.1f ms p99 %.1f ms\n",
			name, n, nq ? pct(queued, nq, 0.5) : 0, nq ? pct(q2, nq, 0.99) : 0,
			pct(build, n, 0.5), pct(b2, n, 0.99), pct(took, n, 0.5), pct(t2, n, 0.99)
	}' "$f"
done
