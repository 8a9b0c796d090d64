package runinfo

import (
	"regexp"
	"runtime/debug"
	"testing"
)

func TestFromSettings(t *testing.T) {
	for _, c := range []struct {
		in   []debug.BuildSetting
		want string
	}{
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "c91b40212345678901234567890123456789abcd"}, {Key: "vcs.modified", Value: "false"}}, "c91b402"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "c91b40212345678901234567890123456789abcd"}, {Key: "vcs.modified", Value: "true"}}, "c91b402-dirty"},
		{[]debug.BuildSetting{{Key: "GOOS", Value: "linux"}}, ""},
	} {
		if got := fromSettings(c.in); got != c.want {
			t.Errorf("fromSettings(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// In go test there is no VCS stamp: Commit asks git (this is a checkout)
// or says Unknown; it never makes a hash up.
func TestCommit(t *testing.T) {
	if c := Commit(); c != Unknown && !regexp.MustCompile(`^[0-9a-f]{7}(-dirty)?$`).MatchString(c) {
		t.Errorf("Commit() = %q", c)
	}
	if d := Date(); !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`).MatchString(d) {
		t.Errorf("Date() = %q", d)
	}
	if l := LoadAvg(); l != "" && !regexp.MustCompile(`^[\d.]+ [\d.]+ [\d.]+$`).MatchString(l) {
		t.Errorf("LoadAvg() = %q", l)
	}
}
