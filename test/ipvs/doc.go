// Package ipvs holds the IPVS dataplane suite that runs inside a VM (build
// tag ipvsvm): the host kernel may have no IPVS, so scripts/vm/test-ipvs.sh
// builds this package's test binary and a static steelyard, boots Debian's
// cloud kernel under qemu (scripts/vm/run.sh) and runs the suite there, on
// the sandbox of network namespaces (test/sandbox) with real traffic.
package ipvs
