package main

import (
	"os"
	"runtime/debug"
)

// defaultGOGC is the garbage collector's target when the environment sets
// no GOGC: the heap may grow to 1.5x what is live between collections
// instead of Go's 2x. The agent's peak of memory is its first sync (the
// decoded API objects, the Builder's ports, the engine's record and the
// rendered batches), and that sync's CPU is mostly nft's and the kernel's
// work on the batches, not Go's. Measured in process at 10,000 Services x
// 10 endpoints (docs/benchmarks.md, "The first sync's CPU"): GOGC 50 took
// the peak from 224 to 181 MiB for 0.4 more CPU-s of Go (1.8 -> 2.2),
// against 18-21 CPU-s for the whole sync into a kernel; GOGC 25 (152 MiB)
// cost 1.6 CPU-s more.
const defaultGOGC = 50

// gcPercent is the GOGC to set: defaultGOGC, unless the environment gives
// GOGC (or GOMEMLIMIT, which the runtime then manages against); ok is false
// when the runtime's own setting stays.
func gcPercent(getenv func(string) string) (percent int, ok bool) {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return 0, false
	}
	return defaultGOGC, true
}

// tuneGC applies gcPercent to this process.
func tuneGC() {
	if p, ok := gcPercent(os.Getenv); ok {
		debug.SetGCPercent(p)
	}
}
