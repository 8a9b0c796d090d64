#!/usr/bin/env bash
# The background builds of `make prebuild` (the Makefile starts this script
# at nice 19 while vet, unit and e2e run in the foreground). Each step only
# fills a cache that a later suite would otherwise fill itself, so a step
# that fails costs nothing but its time: the suite that needs it builds it
# in the foreground, as it would without this script.
#
#   scripts/prebuild.sh    the steps in the order their suites need them
#
# Steps (consumer in brackets):
#   node deps       debootstrap and runc (scripts/install-deps.sh --node),
#                   only as root; first, while the foreground runs no apt
#   control plane   Kubernetes and etcd (scripts/control-plane/build.sh) [k8s]
#   cni plugins     the reference plugins (scripts/cni-plugins.sh)       [cni]
#   vm binaries     the static steelyard and the test binaries of
#                   test/ipvs and test/e2e, built exactly as
#                   scripts/vm/binaries.sh builds them (it is the same
#                   function), into a temporary dir that is removed: this
#                   only warms the Go build cache, the VM scripts still
#                   build their own copies            [ipvs, ebpf-vm-smoke]
#   containerd      scripts/node/containerd.sh                          [node]
#   node images     pause, agnhost, the rootfs and the steelyard and
#                   kube-proxy images (scripts/node/images.sh); only after
#                   the control plane step succeeded, since the kube-proxy
#                   image needs its binary                             [node]
#
# The cache scripts hold their cache's lock (scripts/lib/lock.sh) while
# they build, so a suite that reaches a step still running waits for it
# instead of building the same cache beside it, and two checkouts (CI and a
# manual run) never write one cache at once. The VM binaries take no lock:
# the Go build cache is safe for concurrent use, and a suite that starts
# before the warm-up ends compiles beside it, as it would without it.
# Progress goes to stdout and stderr (bin/prebuild.log); one
# "prebuild: <step> ready|FAILED ... in N s" line per step.
set -uo pipefail
cd "$(dirname "$0")/.."

# step NAME CMD...: runs CMD (its stdout, the cache paths, dropped) and
# reports its wall time; the status is CMD's.
step() {
	local name=$1 t0=$SECONDS rc=0
	shift
	"$@" >/dev/null || rc=$?
	if ((rc == 0)); then
		echo "prebuild: $name ready in $((SECONDS - t0)) s"
	else
		echo "prebuild: $name FAILED (exit $rc) in $((SECONDS - t0)) s; its suite builds it itself"
	fi
	return "$rc"
}

# vm_binaries_warm: each build in a bash of its own, with -e as the VM
# scripts have it (vm_binaries relies on it to stop at a failed build; a
# subshell here would not, inside step's ||) and for vm_binaries' EXIT trap,
# which removes its $out.
vm_binaries_warm() {
	local warm='. scripts/vm/binaries.sh; vm_binaries "$@"'
	bash -euc "$warm" prebuild ipvs ipvsvm ./test/ipvs/ &&
		bash -euc "$warm" prebuild e2e e2e ./test/e2e/
}

start=$SECONDS
if [[ $(id -u) == 0 ]]; then
	step "node deps" scripts/install-deps.sh --node
fi
cp_ok=true
step "control plane" scripts/control-plane/build.sh || cp_ok=false
step "cni plugins" scripts/cni-plugins.sh
step "vm binaries" vm_binaries_warm
step "containerd" scripts/node/containerd.sh
if $cp_ok; then
	step "node images" scripts/node/images.sh
else
	echo "prebuild: node images skipped (the control plane failed); make node builds them"
fi
echo "prebuild: done in $((SECONDS - start)) s"
