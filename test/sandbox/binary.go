package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// AgentBinary returns the steelyard binary a suite drives: $STEELYARD_BIN
// (the Makefile passes bin/steelyard), or a fresh build of cmd/steelyard in
// a temporary directory that cleanup removes.
func AgentBinary(suite string) (path string, cleanup func(), err error) {
	if p := os.Getenv("STEELYARD_BIN"); p != "" {
		return p, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "steelyard-"+suite+"-")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, "steelyard")
	build := exec.Command("go", "build", "-o", path, "github.com/steelyard-net/steelyard/cmd/steelyard")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building cmd/steelyard: %w", err)
	}
	return path, func() { os.RemoveAll(dir) }, nil
}
