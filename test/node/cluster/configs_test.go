package cluster

import (
	"strconv"
	"strings"
	"testing"
)

// NetexecPreStopSeconds must say what NetexecPodSpec does (bench-node's
// lifecycle windows are placed by it).
func TestNetexecPreStop(t *testing.T) {
	if want := "sleep: {seconds: " + strconv.Itoa(NetexecPreStopSeconds) + "}"; !strings.Contains(NetexecPodSpec, want) {
		t.Fatalf("NetexecPodSpec has no %q", want)
	}
}
