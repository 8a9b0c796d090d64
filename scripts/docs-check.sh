#!/usr/bin/env bash
# docs-check: runs the commands of README.md and docs/*.md that are marked
# runnable, against the demo's examples, inside a throwaway network
# namespace (never the machine's own), and fails if one of them fails.
#
# Markers (each on its own line, right before a fenced block):
#   <!-- docs-check -->          the next ```sh block is run with
#                                bash -euo pipefail, 30 s at most, beside an
#                                agent in iptables mode
#   <!-- docs-check nftables --> the same beside an agent in nftables mode
#   <!-- docs-check output -->   the next ``` block lists lines the output
#                                of the previous runnable block must contain
#
# Each mode used gets its own namespace with loopback and `steelyard run
# --manifests examples --mode M` (bounded by `timeout`); blocks run from the
# repository root with bin/ first in PATH. The agents are stopped and the
# namespaces deleted at the end, also on failure or Ctrl-C. Runnable blocks may only read: one
# that calls kubectl, `steelyard run`, `steelyard cleanup` or install-cni
# is refused (commands that need a cluster are shown unmarked in the docs).
#
#   STEELYARD_BIN   the steelyard binary (default bin/steelyard)
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${STEELYARD_BIN:-$PWD/bin/steelyard}
block_timeout=30
agent_timeout=300
if [ "$(id -u)" != 0 ]; then
	echo "docs-check: needs root (it creates a network namespace)" >&2
	exit 1
fi
if [ ! -x "$bin" ]; then
	echo "docs-check: $bin not found; run make build" >&2
	exit 1
fi

work=$(mktemp -d)
modes=(iptables nftables)
declare -A agent=()
cleanup() {
	local m
	for m in "${!agent[@]}"; do
		kill -TERM "${agent[$m]}" 2>/dev/null || true
		wait "${agent[$m]}" 2>/dev/null || true
	done
	for m in "${modes[@]}"; do
		ip netns del "sydocs$$-$m" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# extract FILE: writes $work/N.sh (and $work/N.expect) for each marked block,
# and $work/N.where (file:line).
n=0
extract() {
	local file=$1 lineno=0 state=text line pending= mode=
	while IFS= read -r line || [ -n "$line" ]; do
		lineno=$((lineno + 1))
		case $state in
		text)
			case $line in
			'<!-- docs-check -->') pending=run mode=iptables state=fence ;;
			'<!-- docs-check nftables -->') pending=run mode=nftables state=fence ;;
			'<!-- docs-check output -->')
				if [ "$n" = 0 ] || [ -e "$work/$n.expect" ]; then
					echo "docs-check: $file:$lineno: output marker without a runnable block before it" >&2
					exit 1
				fi
				pending=expect state=fence ;;
			esac ;;
		fence)
			[ -z "$line" ] && continue
			if [ "$pending" = run ] && [ "$line" = '```sh' ]; then
				n=$((n + 1))
				echo "$file:$lineno" >"$work/$n.where"
				echo "$mode" >"$work/$n.mode"
				: >"$work/$n.sh"
				state=run
			elif [ "$pending" = expect ] && [ "$line" = '```' ]; then
				: >"$work/$n.expect"
				state=expect
			else
				echo "docs-check: $file:$lineno: a docs-check marker must be followed by a \`\`\`sh block (output: a \`\`\` block)" >&2
				exit 1
			fi ;;
		run | expect)
			if [ "$line" = '```' ]; then
				state=text
			elif [ "$state" = run ]; then
				echo "$line" >>"$work/$n.sh"
			else
				echo "$line" >>"$work/$n.expect"
			fi ;;
		esac
	done <"$file"
	if [ "$state" != text ]; then
		echo "docs-check: $file: unterminated docs-check block" >&2
		exit 1
	fi
}

for f in README.md docs/*.md; do
	extract "$f"
done
if [ "$n" = 0 ]; then
	echo "docs-check: no runnable blocks found" >&2
	exit 1
fi
for i in $(seq 1 "$n"); do
	if sed -E 's/steelyard +run +--help//g' "$work/$i.sh" |
		grep -Eq '(^|[^-[:alnum:]])(kubectl|install-cni)([^-[:alnum:]]|$)|steelyard +(run|cleanup)([^-[:alnum:]]|$)'; then
		echo "docs-check: $(cat "$work/$i.where"): a runnable block may only read (no kubectl, steelyard run/cleanup, install-cni)" >&2
		exit 1
	fi
done

# start MODE: a namespace with an agent in MODE, waited for until its first
# sync shows in explain (well under a second for examples/; 30 s at most).
start() {
	local m=$1 ns="sydocs$$-$1"
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip netns exec "$ns" timeout "$agent_timeout" "$bin" run --manifests examples --mode "$m" \
		>"$work/agent-$m.log" 2>&1 &
	agent[$m]=$!
	for _ in $(seq 1 150); do
		if ip netns exec "$ns" "$bin" explain --mode "$m" 2>/dev/null | grep -q 'demo/web:http'; then
			return 0
		fi
		if ! kill -0 "${agent[$m]}" 2>/dev/null; then
			break
		fi
		sleep 0.2
	done
	echo "docs-check: the $m agent did not sync examples/:" >&2
	cat "$work/agent-$m.log" >&2
	exit 1
}
for m in $(sort -u "$work"/*.mode); do
	start "$m"
done

pass=0 fail=0
for i in $(seq 1 "$n"); do
	where=$(cat "$work/$i.where")
	mode=$(cat "$work/$i.mode")
	echo "=== $where ($mode)"
	sed 's/^/$ /' "$work/$i.sh"
	status=0
	ip netns exec "sydocs$$-$mode" env PATH="$(dirname "$bin"):$PATH" \
		timeout "$block_timeout" bash -euo pipefail "$work/$i.sh" >"$work/$i.out" 2>&1 || status=$?
	cat "$work/$i.out"
	ok=1
	if [ "$status" != 0 ]; then
		echo "--- FAIL $where: exit status $status"
		ok=0
	elif [ -e "$work/$i.expect" ]; then
		while IFS= read -r want; do
			[ -z "$want" ] && continue
			if ! grep -Fxq -- "$want" "$work/$i.out"; then
				echo "--- FAIL $where: output lacks the line: $want"
				ok=0
			fi
		done <"$work/$i.expect"
	fi
	if [ "$ok" = 1 ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
	fi
done
echo "docs-check: $pass blocks passed, $fail failed"
if [ "$fail" != 0 ]; then
	for m in "${!agent[@]}"; do
		echo "--- $m agent log" >&2
		tail -n 20 "$work/agent-$m.log" >&2
	done
	exit 1
fi
