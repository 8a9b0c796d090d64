package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ProcSys is where the kernel shows the sysctls of the caller's network
// namespace.
const ProcSys = "/proc/sys"

// SetSysctl writes value to the sysctl name ("net.ipv4.ip_forward") of the
// network namespace the process runs in, unless it already holds it.
func SetSysctl(name, value string) error {
	return SetSysctlAt(ProcSys, name, value)
}

// SetSysctlAt is SetSysctl with the sysctl tree rooted at dir instead of
// /proc/sys (tests point it at a temporary directory). A sysctl the kernel
// lacks gives an error that wraps os.ErrNotExist, so callers can tell "the
// feature is missing" from "permission denied".
func SetSysctlAt(dir, name, value string) error {
	cur, err := ReadSysctlAt(dir, name)
	if err != nil {
		return err
	}
	if cur == value {
		return nil
	}
	if err := os.WriteFile(sysctlPath(dir, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// ReadSysctlAt returns the value of sysctl name under dir, without the
// trailing newline.
func ReadSysctlAt(dir, name string) (string, error) {
	cur, err := os.ReadFile(sysctlPath(dir, name))
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(cur)), nil
}

func sysctlPath(dir, name string) string {
	return filepath.Join(dir, strings.ReplaceAll(name, ".", "/"))
}
