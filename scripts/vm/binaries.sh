# Sourced by scripts/vm/test-*.sh: builds a static steelyard and one static
# test binary for the VM (the guest has no libc of ours), into $out, a
# temporary directory removed on exit.
#
#   vm_binaries NAME TAGS PACKAGE   ->  $out/steelyard, $out/NAME.test
vm_binaries() {
	local name=$1 tags=$2 pkg=$3 start
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
	start=$(date +%s.%N)
	CGO_ENABLED=0 ${GO:-go} build -trimpath -o "$out/steelyard" ./cmd/steelyard
	CGO_ENABLED=0 ${GO:-go} test -c -tags "$tags" -o "$out/$name.test" "$pkg"
	echo "$(basename "$0" .sh): binaries built in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}") s" >&2
}
