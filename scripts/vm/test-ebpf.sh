#!/usr/bin/env bash
# The ebpf rows of the kernel table (test/e2e, TestKernel/<case>/ebpf) on a
# second kernel: Debian's 6.1 cloud kernel in the VM (scripts/vm/run.sh),
# where the host runs 6.18. Builds a static steelyard and the static e2e
# test binary, boots the VM (cgroup2 on /sys/fs/cgroup, a bpffs, the
# nftables modules) and runs the rows inside it. Exits with their status.
# Runs as root (apt).
#
#   scripts/vm/test-ebpf.sh [go test flags; default: the ebpf rows]
set -euo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}

. scripts/vm/binaries.sh # after the cd above: paths from the repository root
vm_binaries e2e e2e ./test/e2e/

if [ $# -eq 0 ]; then
	set -- -test.run '^TestKernel$/./^ebpf$'
fi
# Boot plus rows in at most EBPF_VM_TIMEOUT seconds (10 minutes by default).
vm_timeout=${EBPF_VM_TIMEOUT:-600}
scripts/vm/run.sh --timeout "$vm_timeout" --add "$out/steelyard:/work/steelyard" --add "$out/e2e.test:/work/e2e.test" -- \
	env STEELYARD_BIN=/work/steelyard \
	/work/e2e.test -test.v -test.count=1 -test.timeout=$((vm_timeout - 10))s "$@"
