package main

import (
	"regexp"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// notSemVer is what a SemVer pre-release identifier cannot hold.
var notSemVer = regexp.MustCompile(`[^0-9A-Za-z.-]+`)

// chartVersion turns the build's VERSION (git describe --always --dirty)
// into the SemVer 2 version a chart needs: "v1.2.3" and "v1.2.3-4-gabc"
// lose their "v"; anything else (a bare commit "c91b402-dirty", "dev")
// becomes a pre-release of 0.0.0: "0.0.0-gc91b402-dirty", so that a
// release tag always sorts above it.
func chartVersion(v string) string {
	if s := strings.TrimPrefix(v, "v"); isSemVer(s) {
		return s
	}
	pre := strings.Trim(notSemVer.ReplaceAllString(v, "-"), ".-")
	if pre == "" {
		return "0.0.0-dev"
	}
	// "g" keeps an all-digit commit from being a numeric identifier with a
	// leading zero, which SemVer forbids.
	if s := "0.0.0-g" + pre; isSemVer(s) {
		return s
	}
	return "0.0.0-dev"
}

func isSemVer(s string) bool {
	_, err := semver.StrictNewVersion(s)
	return err == nil
}
