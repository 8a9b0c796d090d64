package dataplane

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// SetSysctl writes value to the sysctl name ("net.ipv4.ip_forward") of the
// network namespace the process runs in, unless it already holds it.
func SetSysctl(name, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	cur, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("sysctl %s: %w", name, err)
	}
	if strings.TrimSpace(string(cur)) == value {
		return nil
	}
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}
