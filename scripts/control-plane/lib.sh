# shellcheck shell=bash
# Helpers shared by the scripts that build Kubernetes binaries from the
# wrapper module in k8s/ (scripts/control-plane/build.sh,
# scripts/conformance/build.sh). Source it; it defines functions only.

# required <module> <module dir>: the version the wrapper's go.mod requires,
# so go.mod stays the single place to change it.
required() {
	awk -v m="$1" '($1 == "require" && $2 == m) { print $3 } ($1 == m && $2 ~ /^v/) { print $2 }' "$2/go.mod" | head -n1
}

# reports <binary> <version> <args...>: the binary runs and prints the version.
reports() {
	local bin=$1 want=$2 out
	shift 2
	[[ -x $bin ]] || return 1
	out=$("$bin" "$@" 2>&1) || return 1
	[[ $out == *"$want"* ]]
}

# k8s_ldflags <version>: what stamps k8s.io/component-base/version, so the
# binaries report <version> (as the upstream release build does).
k8s_ldflags() {
	local v=k8s.io/component-base/version
	[[ $1 =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || return 1
	echo "-s -w -X $v.gitVersion=$1 -X $v.gitMajor=${BASH_REMATCH[1]} -X $v.gitMinor=${BASH_REMATCH[2]} -X $v.gitTreeState=clean"
}

# build_into <final dir> <module dir> <function> <args...>: runs
# `<function> <tmp dir> <args...>` in the module dir (a go build or go test
# -c writing into the tmp dir, which sits beside the final one), then
# renames the tmp dir into place, so an interrupted build never leaves a
# half-written cache behind.
build_into() {
	local dest=$1 mod=$2
	shift 2
	mkdir -p "$(dirname "$dest")"
	local tmp
	tmp=$(mktemp -d "$dest.tmp.XXXXXX")
	chmod 755 "$tmp" # mktemp makes it 0700; others (sudo, CI users) read the cache
	# shellcheck disable=SC2064 # expand $tmp now
	trap "rm -rf '$tmp'" EXIT
	local fn=$1
	shift
	(cd "$mod" && "$fn" "$tmp" "$@")
	rm -rf "$dest"
	mv "$tmp" "$dest"
	trap - EXIT
}
