package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
)

// cmdRender writes the rendered tree into dir and removes the files there
// that the chart no longer renders (except the hand-kept ones).
func cmdRender(chartDir, dir string) error {
	if dir == "" {
		return errors.New("-out is required")
	}
	c, err := Load(chartDir, "")
	if err != nil {
		return err
	}
	tree, err := Manifests(c)
	if err != nil {
		return err
	}
	if err := writeTree(dir, tree); err != nil {
		return err
	}
	have, err := listTree(dir)
	if err != nil {
		return err
	}
	for _, rel := range have {
		if _, ok := tree[rel]; !ok && !isHandKept(rel) {
			if err := os.Remove(filepath.Join(dir, rel)); err != nil {
				return err
			}
			fmt.Printf("removed %s (the chart no longer renders it)\n", filepath.Join(dir, rel))
		}
	}
	fmt.Printf("rendered %d files from %s into %s\n", len(tree), chartDir, dir)
	return nil
}

// cmdTemplate writes the chart rendered with the -set values into dir, one
// file a template by its path under templates/ (helm template): what a
// harness applies with kubectl when it must change an object before the
// first pod starts. Values are checked against the schema as install
// checks them; lookup finds nothing (no cluster), as in helm template.
func cmdTemplate(chartDir, version, dir string, set setFlags) error {
	if dir == "" {
		return errors.New("-out is required")
	}
	c, vals, err := chartAndValues(chartDir, version, set)
	if err != nil {
		return err
	}
	files, err := Render(c, vals)
	if err != nil {
		return err
	}
	tree := map[string][]byte{}
	for rel, text := range files {
		tree[rel] = []byte(text)
	}
	if err := writeTree(dir, tree); err != nil {
		return err
	}
	fmt.Printf("rendered %d files from %s with %d values into %s\n", len(tree), chartDir, len(set), dir)
	return nil
}

// writeTree writes each file of tree under dir.
func writeTree(dir string, tree map[string][]byte) error {
	for _, rel := range sortedKeys(tree) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, tree[rel], 0o644); err != nil {
			return err
		}
	}
	return nil
}

// listTree returns the regular files under dir, relative to it.
func listTree(dir string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return err
	})
	return files, err
}

// Diff compares tree with the files under dir and returns one line per
// difference: a file that differs, is missing, or is not rendered by the
// chart (hand-kept files aside). Empty: they are the same.
func Diff(tree map[string][]byte, dir string) ([]string, error) {
	var diffs []string
	for _, rel := range sortedKeys(tree) {
		have, err := os.ReadFile(filepath.Join(dir, rel))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			diffs = append(diffs, rel+": missing (the chart renders it)")
		case err != nil:
			return nil, err
		case !bytes.Equal(have, tree[rel]):
			diffs = append(diffs, rel+": differs from the chart's render")
		}
	}
	have, err := listTree(dir)
	if err != nil {
		return nil, err
	}
	for _, rel := range have {
		if _, ok := tree[rel]; !ok && !isHandKept(rel) {
			diffs = append(diffs, rel+": not rendered by the chart")
		}
	}
	return diffs, nil
}

// cmdCheck lints the chart, renders it into a temporary directory and
// compares that with the committed manifests/.
func cmdCheck(chartDir, manifests string) error {
	if err := Lint(chartDir); err != nil {
		return err
	}
	c, err := Load(chartDir, "")
	if err != nil {
		return err
	}
	tree, err := Manifests(c)
	if err != nil {
		return err
	}
	diffs, err := Diff(tree, manifests)
	if err != nil {
		return err
	}
	if len(diffs) == 0 {
		fmt.Printf("chart lint clean; %s is the chart's render (%d files)\n", manifests, len(tree))
		return nil
	}
	tmp, err := os.MkdirTemp("", "steelyard-chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := writeTree(tmp, tree); err != nil {
		return err
	}
	var b strings.Builder
	for _, d := range diffs {
		fmt.Fprintf(&b, "  %s/%s\n", manifests, d)
	}
	// diff(1) (diffutils, always on Debian) shows the lines of each file
	// that differs; without it the list above still says what to do.
	for _, d := range diffs {
		rel, ok := strings.CutSuffix(d, ": differs from the chart's render")
		if !ok {
			continue
		}
		out, err := exec.Command("diff", "-u", filepath.Join(manifests, rel), filepath.Join(tmp, rel)).CombinedOutput()
		if len(out) > 0 {
			b.Write(out)
		} else if err != nil {
			fmt.Fprintf(&b, "(diff: %v)\n", err)
		}
	}
	return fmt.Errorf("%s differs from the chart %s:\n%s"+
		"manifests/ is generated: edit %s (templates, values.yaml) and run `make manifests`", manifests, chartDir, b.String(), chartDir)
}

// lintValues are the value sets the chart is linted with: the defaults,
// and every optional part on (so that each template renders once).
var lintValues = []map[string]any{
	nil,
	{
		"apiServer": "198.19.0.1:6443", "clusterCIDR": "198.19.64.0/18", "mode": "nftables",
		"ingress":          map[string]any{"enabled": true, "upstreams": "pods", "defaultClass": true},
		"gateway":          map[string]any{"enabled": true, "addressPool": "198.18.255.0/24"},
		"metrics":          map[string]any{"enabled": false},
		"countConnections": true,
		"cni":              map[string]any{"install": false},
		"extraArgs":        []any{"--localhost-nodeports=false"},
	},
	{"mode": "ebpf", "ebpf": map[string]any{"cgroupPath": "/sys/fs/cgroup/unified", "pinDir": "/sys/fs/bpf/sy"}},
}

// Lint runs Helm's chart linter (what helm lint --strict runs) with each of
// lintValues and fails on any warning or error.
func Lint(chartDir string) error {
	var problems []string
	for i, vals := range lintValues {
		res := lint.RunAll(chartDir, vals, "steelyard")
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				problems = append(problems, fmt.Sprintf("values set %d: %s", i, m.Error()))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("helm lint %s:\n  %s", chartDir, strings.Join(problems, "\n  "))
	}
	return nil
}

// cmdPackage writes the chart, stamped with version, as a .tgz into dir.
func cmdPackage(chartDir, version, dir string) error {
	if version == "" || dir == "" {
		return errors.New("-version and -out are required")
	}
	if err := Lint(chartDir); err != nil {
		return err
	}
	c, err := Load(chartDir, version)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p, err := chartutil.Save(c, dir)
	if err != nil {
		return err
	}
	fmt.Printf("%s (version %s, appVersion %s)\n", p, c.Metadata.Version, c.Metadata.AppVersion)
	return nil
}
