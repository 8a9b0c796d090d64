// Package runinfo names the run a committed result came from: the commit
// the measuring binary was built from, the date and the machine's load
// average. Benchmarks (test/bench/k8s, scale, node) and the conformance
// runner write these beside every point, so each figure in README.md and
// docs/ traces to a run on a named commit (test/docsgen prints them).
package runinfo

import (
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"time"
)

// Unknown is what Commit returns when neither the binary nor git says.
const Unknown = "unknown"

// Commit is the short hash of the commit the running binary was built
// from, with "-dirty" when the tree had uncommitted changes then. It
// reads the VCS stamp `go build` writes into the binary; without one (go
// run, go test, -buildvcs=false) it asks git about the working directory,
// and says Unknown when that fails too.
func Commit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		if c := fromSettings(bi.Settings); c != "" {
			return c
		}
	}
	return fromGit()
}

// fromSettings reads vcs.revision and vcs.modified of a build's settings.
func fromSettings(settings []debug.BuildSetting) string {
	rev, dirty := "", false
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	return short(rev, dirty)
}

func short(rev string, dirty bool) string {
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func fromGit() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return Unknown
	}
	rev := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	return short(rev, err != nil || len(strings.TrimSpace(string(st))) > 0)
}

// Date is now in RFC 3339, UTC, to the second.
func Date() string { return time.Now().UTC().Format(time.RFC3339) }

// LoadAvg is /proc/loadavg's 1, 5 and 15 minute figures ("0.42 0.61
// 0.80"), or "" where the file cannot be read.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
