package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The test binary doubles as the plugin: with STEELYARD_CNI_MAIN=1 it runs
// main, so the tests see exactly what a runtime sees (stdout, exit code).
func TestMain(m *testing.M) {
	if os.Getenv("STEELYARD_CNI_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runPlugin(t *testing.T, command, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "STEELYARD_CNI_MAIN=1", "CNI_COMMAND="+command,
		"CNI_CONTAINERID=c1", "CNI_NETNS=/run/netns/does-not-exist", "CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin")
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestUnchainedAddIsACNIError(t *testing.T) {
	stdout, _, code := runPlugin(t, "ADD", `{"cniVersion": "1.0.0", "name": "net", "type": "steelyard-cni"}`)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	var e struct {
		CNIVersion string `json:"cniVersion"`
		Code       uint   `json:"code"`
		Msg        string `json:"msg"`
	}
	if err := json.Unmarshal([]byte(stdout), &e); err != nil {
		t.Fatalf("stdout is not one JSON CNI error: %v\n%s", err, stdout)
	}
	if e.Code != 7 || !strings.Contains(e.Msg, "must be chained") {
		t.Errorf("error %+v, want code 7 (invalid network config) and a message saying it must be chained", e)
	}
}

func TestVersion(t *testing.T) {
	stdout, _, code := runPlugin(t, "VERSION", `{"cniVersion": "1.1.0"}`)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("stdout %q: %v", stdout, err)
	}
	if strings.Join(v.Supported, ",") != "0.4.0,1.0.0,1.1.0" {
		t.Errorf("supported versions %v", v.Supported)
	}
}

func TestDelWithNothingToDoSucceeds(t *testing.T) {
	// No prevResult, the namespace is gone: DEL succeeds and prints nothing.
	stdout, stderr, code := runPlugin(t, "DEL", `{"cniVersion": "1.0.0", "name": "net", "type": "steelyard-cni"}`)
	if code != 0 || stdout != "" {
		t.Errorf("exit %d stdout %q stderr %q, want 0 and no output", code, stdout, stderr)
	}
}
