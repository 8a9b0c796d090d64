#!/usr/bin/env bash
# The IPVS suite: builds a static steelyard and the static test binary of
# test/ipvs, boots the VM (scripts/vm/run.sh) and runs the suite inside it
# with real traffic. Exits with the suite's status. Runs as root (apt).
#
#   scripts/vm/test-ipvs.sh [go test flags, e.g. -test.run TestIPVS/shares]
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}

. scripts/vm/binaries.sh # after the cd above: paths from the repository root
vm_binaries ipvs ipvsvm ./test/ipvs/

adds=(--add "$out/steelyard:/work/steelyard" --add "$out/ipvs.test:/work/ipvs.test")
for f in examples/*.yaml; do
	adds+=(--add "$f:/work/examples/$(basename "$f")")
done
# The VM part is bounded: boot plus suite in at most IPVS_VM_TIMEOUT
# seconds (about 10 s of it is the boot under TCG; 2 minutes by default;
# the Makefile gives TestIPVSCapabilities and TestIPVSChaos a VM of their
# own, with 300 s and 420 s).
vm_timeout=${IPVS_VM_TIMEOUT:-120}
scripts/vm/run.sh --timeout "$vm_timeout" "${adds[@]}" -- \
	env STEELYARD_BIN=/work/steelyard STEELYARD_EXAMPLES=/work/examples \
	/work/ipvs.test -test.v -test.count=1 -test.timeout=$((vm_timeout - 10))s "$@"
