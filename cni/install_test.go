package cni

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const flannelConflist = `{
  "name": "cbr0",
  "cniVersion": "1.0.0",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

func pluginTypes(t *testing.T, data []byte) []string {
	t.Helper()
	var c struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("not a conflist: %v\n%s", err, data)
	}
	var out []string
	for _, p := range c.Plugins {
		out = append(out, p["type"].(string))
	}
	return out
}

func TestChainConflistAppendsLast(t *testing.T) {
	out, changed, err := ChainConflist([]byte(flannelConflist), ChainEntry)
	if err != nil || !changed {
		t.Fatalf("changed %v err %v", changed, err)
	}
	if got := strings.Join(pluginTypes(t, out), ","); got != "flannel,portmap,steelyard-cni" {
		t.Errorf("plugins %s, want flannel,portmap,steelyard-cni", got)
	}
	var c map[string]any
	json.Unmarshal(out, &c)
	if c["name"] != "cbr0" || c["cniVersion"] != "1.0.0" {
		t.Errorf("top-level keys changed: %v", c)
	}
	last := c["plugins"].([]any)[2].(map[string]any)
	if last["hairpin"] != true || last["conntrackCleanup"] != true {
		t.Errorf("entry %v, want both options on", last)
	}
	if !strings.Contains(string(out), `"delegate": {`) {
		t.Errorf("other plugins' settings were lost:\n%s", out)
	}
	// Idempotent: a second pass changes nothing.
	again, changed, err := ChainConflist(out, ChainEntry)
	if err != nil || changed || string(again) != string(out) {
		t.Errorf("second pass: changed %v err %v", changed, err)
	}
}

func TestChainConflistAlreadyThere(t *testing.T) {
	// An operator put steelyard-cni in the middle, with its own options:
	// left exactly as it is.
	in := `{"cniVersion": "0.4.0", "name": "n", "plugins": [{"type": "bridge"}, {"type": "steelyard-cni", "hairpin": false}, {"type": "portmap"}]}`
	out, changed, err := ChainConflist([]byte(in), ChainEntry)
	if err != nil || changed || string(out) != in {
		t.Errorf("changed %v err %v out %s", changed, err, out)
	}
}

func TestChainConflistMalformed(t *testing.T) {
	for name, in := range map[string]string{
		"not JSON":            `{"cniVersion": "1.0.0", "plugins": [`,
		"array":               `[]`,
		"null":                `null`,
		"no cniVersion":       `{"name": "n", "plugins": [{"type": "bridge"}]}`,
		"single-plugin .conf": `{"cniVersion": "1.0.0", "name": "n", "type": "bridge"}`,
		"plugins not a list":  `{"cniVersion": "1.0.0", "plugins": {"type": "bridge"}}`,
		"empty plugins":       `{"cniVersion": "1.0.0", "plugins": []}`,
		"plugin without type": `{"cniVersion": "1.0.0", "plugins": [{"bridge": "cni0"}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := ChainConflist([]byte(in), ChainEntry)
			if !errors.Is(err, ErrMalformedConflist) {
				t.Errorf("err %v, want ErrMalformedConflist", err)
			}
		})
	}
}

type installDirs struct{ plugin, bin, conf string }

func newInstallDirs(t *testing.T) installDirs {
	dir := t.TempDir()
	d := installDirs{plugin: filepath.Join(dir, "steelyard-cni"), bin: filepath.Join(dir, "bin"), conf: filepath.Join(dir, "net.d")}
	for _, p := range []string{d.bin, d.conf} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(d.plugin, []byte("#!/bin/sh\n# plugin v1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d installDirs) install(t *testing.T) error {
	t.Helper()
	return Install(InstallOptions{Plugin: d.plugin, BinDir: d.bin, ConfDir: d.conf, Logf: t.Logf})
}

// snapshot returns every file of the two folders with its content and
// modification time, to show that nothing changed.
func (d installDirs) snapshot(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{d.bin, d.conf} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			b, _ := os.ReadFile(p)
			st, _ := os.Stat(p)
			out[p] = string(b) + "|" + st.ModTime().String() + "|" + st.Mode().String()
		}
	}
	return out
}

func TestInstall(t *testing.T) {
	d := newInstallDirs(t)
	// The runtime uses the first file in lexical order (10-flannel); the
	// second one must not change.
	os.WriteFile(filepath.Join(d.conf, "10-flannel.conflist"), []byte(flannelConflist), 0o600)
	os.WriteFile(filepath.Join(d.conf, "99-other.conflist"), []byte(`{"cniVersion": "1.0.0", "plugins": [{"type": "ptp"}]}`), 0o644)
	os.WriteFile(filepath.Join(d.conf, "README"), []byte("not a CNI file"), 0o644)
	if err := d.install(t); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(d.conf, "10-flannel.conflist"))
	if types := strings.Join(pluginTypes(t, got), ","); types != "flannel,portmap,steelyard-cni" {
		t.Errorf("plugins %s", types)
	}
	if st, _ := os.Stat(filepath.Join(d.conf, "10-flannel.conflist")); st.Mode().Perm() != 0o600 {
		t.Errorf("conflist mode %v, want the original 0600", st.Mode().Perm())
	}
	other, _ := os.ReadFile(filepath.Join(d.conf, "99-other.conflist"))
	if strings.Contains(string(other), "steelyard") {
		t.Error("the second conflist (not the one the runtime uses) was edited")
	}
	bin, _ := os.ReadFile(filepath.Join(d.bin, "steelyard-cni"))
	if string(bin) != "#!/bin/sh\n# plugin v1\n" {
		t.Errorf("installed binary %q", bin)
	}
	if st, _ := os.Stat(filepath.Join(d.bin, "steelyard-cni")); st.Mode().Perm() != 0o755 {
		t.Errorf("binary mode %v, want 0755", st.Mode().Perm())
	}

	// Twice: nothing changes, not even a modification time; no temporary
	// files are left behind.
	before := d.snapshot(t)
	if err := d.install(t); err != nil {
		t.Fatal(err)
	}
	after := d.snapshot(t)
	if len(before) != len(after) {
		t.Errorf("files before %v, after %v", keys(before), keys(after))
	}
	for p, v := range before {
		if after[p] != v {
			t.Errorf("%s changed on the second run", p)
		}
	}

	// A new plugin binary replaces the old one.
	os.WriteFile(d.plugin, []byte("#!/bin/sh\n# plugin v2\n"), 0o755)
	if err := d.install(t); err != nil {
		t.Fatal(err)
	}
	if bin, _ := os.ReadFile(filepath.Join(d.bin, "steelyard-cni")); !strings.Contains(string(bin), "v2") {
		t.Errorf("binary not updated: %q", bin)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestInstallMalformedLeftUntouched(t *testing.T) {
	d := newInstallDirs(t)
	bad := `{"cniVersion": "1.0.0", "plugins": [{"type": "flannel"},]}`
	path := filepath.Join(d.conf, "10-flannel.conflist")
	os.WriteFile(path, []byte(bad), 0o644)
	before := d.snapshot(t)
	err := d.install(t)
	if !errors.Is(err, ErrMalformedConflist) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "left untouched") {
		t.Fatalf("err %v, want a malformed-conflist error naming %s", err, path)
	}
	if got, _ := os.ReadFile(path); string(got) != bad {
		t.Errorf("malformed conflist was changed:\n%s", got)
	}
	for p, v := range d.snapshot(t) {
		if p != filepath.Join(d.bin, "steelyard-cni") && before[p] != v {
			t.Errorf("%s changed", p)
		}
	}
}

func TestInstallNoConflist(t *testing.T) {
	d := newInstallDirs(t)
	err := d.install(t)
	if err == nil || !strings.Contains(err.Error(), "no CNI configuration") {
		t.Errorf("err %v, want 'no CNI configuration'", err)
	}
}

// The example conflist in manifests/ is what install-cni produces for a
// bridge set-up: steelyard-cni already last, so install-cni leaves it alone.
func TestExampleConflist(t *testing.T) {
	data, err := os.ReadFile("../manifests/cni/10-steelyard.conflist")
	if err != nil {
		t.Fatal(err)
	}
	out, changed, err := ChainConflist(data, ChainEntry)
	if err != nil || changed || string(out) != string(data) {
		t.Fatalf("changed %v err %v", changed, err)
	}
	types := pluginTypes(t, data)
	if types[len(types)-1] != PluginType {
		t.Errorf("plugins %v: steelyard-cni is not last", types)
	}
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	json.Unmarshal(data, &list)
	entry := strings.Replace(string(list.Plugins[len(list.Plugins)-1]), "{", `{"cniVersion": "`+list.CNIVersion+`", `, 1)
	c, err := ParseConfig([]byte(entry))
	if err != nil || !c.HairpinOn() || !c.ConntrackCleanupOn() {
		t.Errorf("example entry %s: %+v, %v", entry, c, err)
	}
}
