package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ChainEntry is the conflist entry install-cni appends: the plugin with
// both options spelled out, so an operator reading the file sees them.
var ChainEntry = map[string]any{"type": PluginType, "hairpin": true, "conntrackCleanup": true}

// ErrMalformedConflist marks a conflist that install-cni will not edit.
var ErrMalformedConflist = errors.New("malformed conflist")

// ChainConflist returns conflist with entry appended as its last plugin.
// changed is false (and out equals data) when a plugin of the entry's type
// is already in the list. A conflist that is not a JSON object with a
// non-empty "plugins" array of objects that each have a "type" returns an
// error wrapping ErrMalformedConflist. Other plugins' entries are kept
// byte for byte; top-level keys keep their values.
func ChainConflist(data []byte, entry map[string]any) (out []byte, changed bool, err error) {
	typ, _ := entry["type"].(string)
	if typ == "" {
		return nil, false, errors.New("chain entry has no type")
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrMalformedConflist, err)
	}
	if top == nil {
		return nil, false, fmt.Errorf("%w: not a JSON object", ErrMalformedConflist)
	}
	if _, ok := top["cniVersion"]; !ok {
		return nil, false, fmt.Errorf("%w: no cniVersion", ErrMalformedConflist)
	}
	rawPlugins, ok := top["plugins"]
	if !ok {
		return nil, false, fmt.Errorf("%w: no \"plugins\" list (a single-plugin .conf must be turned into a .conflist first)", ErrMalformedConflist)
	}
	var plugins []json.RawMessage
	if err := json.Unmarshal(rawPlugins, &plugins); err != nil {
		return nil, false, fmt.Errorf("%w: \"plugins\": %v", ErrMalformedConflist, err)
	}
	if len(plugins) == 0 {
		return nil, false, fmt.Errorf("%w: \"plugins\" is empty: there is no main plugin to chain after", ErrMalformedConflist)
	}
	for i, p := range plugins {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(p, &head); err != nil || head.Type == "" {
			return nil, false, fmt.Errorf("%w: plugin %d has no \"type\"", ErrMalformedConflist, i)
		}
		if head.Type == typ {
			return data, false, nil
		}
	}
	e, err := json.Marshal(entry)
	if err != nil {
		return nil, false, err
	}
	plugins = append(plugins, e)
	if top["plugins"], err = json.Marshal(plugins); err != nil {
		return nil, false, err
	}
	flat, err := json.Marshal(top)
	if err != nil {
		return nil, false, err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, flat, "", "  "); err != nil {
		return nil, false, err
	}
	buf.WriteByte('\n')
	return buf.Bytes(), true, nil
}

// InstallOptions say where install-cni puts the plugin.
type InstallOptions struct {
	// Plugin is the steelyard-cni binary to copy.
	Plugin string
	// BinDir is the node's CNI bin folder (/opt/cni/bin).
	BinDir string
	// ConfDir is the node's CNI configuration folder (/etc/cni/net.d).
	ConfDir string
	// Conflist is the file to edit, relative to ConfDir; empty: the file
	// the runtime uses, i.e. the first *.conflist, *.conf or *.json in
	// lexical order.
	Conflist string
	// Wait is how long to wait for a conflist to appear (the main CNI
	// plugin may install it after us); zero: fail at once.
	Wait time.Duration
	// Logf receives one line per action.
	Logf func(format string, args ...any)
}

// Install copies the plugin into BinDir and chains it into the conflist,
// each step atomic (a temporary file in the same folder, then rename) and
// idempotent (an identical binary or a conflist that already chains the
// plugin is left alone). A malformed conflist is reported and left as is.
func Install(o InstallOptions) error {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	bin, err := os.ReadFile(o.Plugin)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	dst := filepath.Join(o.BinDir, PluginType)
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, bin) {
		logf("%s is up to date", dst)
	} else {
		if err := writeAtomic(dst, bin, 0o755); err != nil {
			return fmt.Errorf("installing the plugin: %w", err)
		}
		logf("installed %s", dst)
	}

	path, err := findConflist(o.ConfDir, o.Conflist, o.Wait)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, changed, err := ChainConflist(data, ChainEntry)
	if err != nil {
		return fmt.Errorf("%s: %w (left untouched)", path, err)
	}
	if !changed {
		logf("%s already chains %s; left untouched", path, PluginType)
		return nil
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	if err := writeAtomic(path, out, mode); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	logf("%s: appended %s as the last plugin", path, PluginType)
	return nil
}

// findConflist returns the conflist to edit, waiting up to wait for one.
func findConflist(dir, name string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		path, err := pickConflist(dir, name)
		if err == nil || time.Now().After(deadline) {
			return path, err
		}
		time.Sleep(time.Second)
	}
}

func pickConflist(dir, name string) (string, error) {
	if name != "" {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			return "", fmt.Errorf("conflist: %w", err)
		}
		return path, nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("CNI configuration folder: %w", err)
	}
	var names []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if !e.IsDir() && (ext == ".conflist" || ext == ".conf" || ext == ".json") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no CNI configuration in %s: is the main CNI plugin installed?", dir)
	}
	// The runtime loads the first file in lexical order; that is the one
	// pods get.
	sort.Strings(names)
	return filepath.Join(dir, names[0]), nil
}

// writeAtomic replaces path with data: readers see the old or the new
// file, never a partial one. The temporary name has no CNI extension, so a
// runtime watching the folder ignores it.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir, base := filepath.Split(path)
	tmp, err := os.CreateTemp(dir, "."+strings.TrimPrefix(base, ".")+".tmp-")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, bytes.NewReader(data)); err != nil {
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	ok = true
	return nil
}
