package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path"
	"reflect"
	"slices"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"sigs.k8s.io/yaml"
)

// The folders of manifests/ that hold the opt-in layers, each rendered
// with its value <folder>.enabled=true (the default render leaves them
// empty, so an agent without the layer keeps the smaller RBAC grant).
var optIn = []string{"ingress", "gateway"}

// handKept are files of manifests/ that are not Kubernetes objects and not
// rendered from the chart: the example conflist is what install-cni writes
// for a bridge conflist (cni/install_test.go reads it).
var handKept = []string{"cni/10-steelyard.conflist"}

// ingressPatch is the DaemonSet patch of manifests/ingress/ that turns
// the L7 layer on for kubectl users (test/node/cluster.Install applies it).
const ingressPatch = "ingress/patch/ingress-on.json"

// Load reads the chart in dir. version, when not empty, is the build's
// VERSION (git describe): it becomes appVersion, and its SemVer form the
// chart's version (chartVersion).
func Load(dir, version string) (*chart.Chart, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	if version != "" {
		c.Metadata.Version = chartVersion(version)
		c.Metadata.AppVersion = version
	}
	return c, nil
}

// Render renders c with vals (merged over values.yaml, checked against
// values.schema.json) as helm install would, and returns each non-empty
// template's output by its path under templates/ ("30-daemonset.yaml",
// "ingress/10-rbac.yaml"). Partials and NOTES.txt are left out.
func Render(c *chart.Chart, vals map[string]any) (map[string]string, error) {
	opts := common.ReleaseOptions{Name: "steelyard", Namespace: "steelyard", IsInstall: true}
	top, err := util.ToRenderValuesWithSchemaValidation(c, vals, opts, common.DefaultCapabilities, false)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(c, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	files := map[string]string{}
	prefix := c.Name() + "/templates/"
	for name, text := range out {
		rel, ok := strings.CutPrefix(name, prefix)
		if !ok || strings.HasPrefix(path.Base(rel), "_") || rel == "NOTES.txt" || strings.TrimSpace(text) == "" {
			continue
		}
		files[rel] = strings.TrimRight(text, "\n") + "\n"
	}
	return files, nil
}

// Manifests renders the tree of manifests/ from the chart's defaults: the
// top-level files from the default values, each opt-in folder from the
// defaults with that layer enabled, and manifests/ingress/patch/
// ingress-on.json from the difference the ingress layer makes to the
// DaemonSet. Keys are paths relative to manifests/.
func Manifests(c *chart.Chart) (map[string][]byte, error) {
	base, err := Render(c, nil)
	if err != nil {
		return nil, err
	}
	tree := map[string][]byte{}
	for rel, text := range base {
		if strings.Contains(rel, "/") {
			return nil, fmt.Errorf("templates/%s renders with the default values; an opt-in layer must render nothing unless enabled", rel)
		}
		tree[rel] = []byte(text)
	}
	for _, layer := range optIn {
		on, err := Render(c, map[string]any{layer: map[string]any{"enabled": true}})
		if err != nil {
			return nil, fmt.Errorf("%s.enabled=true: %w", layer, err)
		}
		n := 0
		for rel, text := range on {
			if strings.HasPrefix(rel, layer+"/") {
				tree[rel] = []byte(text)
				n++
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("%s.enabled=true renders nothing under templates/%s/", layer, layer)
		}
		if layer == "ingress" {
			p, err := argsPatch(base["30-daemonset.yaml"], on["30-daemonset.yaml"])
			if err != nil {
				return nil, fmt.Errorf("ingress.enabled=true: %w", err)
			}
			tree[ingressPatch] = p
		}
	}
	for rel, text := range tree {
		if strings.HasSuffix(rel, ".yaml") {
			tree[rel] = append([]byte(generatedHeader), text...)
		}
	}
	return tree, nil
}

// generatedHeader starts every YAML file of manifests/.
const generatedHeader = "# Rendered from charts/steelyard by `make manifests`: edit the chart, not this file.\n"

// jsonOp is one RFC 6902 operation of a kubectl patch --type=json.
type jsonOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value"`
}

// The two lists a layer may append to, as JSON pointers into the DaemonSet.
var (
	argsPtr = []string{"spec", "template", "spec", "containers", "0", "args"}
	capsPtr = []string{"spec", "template", "spec", "containers", "0", "securityContext", "capabilities", "add"}
)

// argsPatch returns the JSON patch that turns the DaemonSet off into on,
// which must differ only by items appended to the agent container's args
// and added capabilities (anything else cannot be a patch of appends, and
// is an error).
func argsPatch(off, on string) ([]byte, error) {
	var a, b map[string]any
	if err := yaml.Unmarshal([]byte(off), &a); err != nil {
		return nil, err
	}
	if err := yaml.Unmarshal([]byte(on), &b); err != nil {
		return nil, err
	}
	var ops []jsonOp
	for _, ptr := range [][]string{argsPtr, capsPtr} {
		x, y := take(a, ptr), take(b, ptr)
		if len(y) < len(x) || !reflect.DeepEqual(x, y[:len(x)]) {
			return nil, fmt.Errorf("/%s: %v is not %v with items appended", strings.Join(ptr, "/"), y, x)
		}
		for _, v := range y[len(x):] {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("/%s: %v is not a string", strings.Join(ptr, "/"), v)
			}
			ops = append(ops, jsonOp{"add", "/" + strings.Join(ptr, "/") + "/-", s})
		}
	}
	// pod template annotations (the config hash) do not change with a
	// layer, so the rest must be equal.
	if !reflect.DeepEqual(a, b) {
		return nil, fmt.Errorf("the DaemonSet changes beyond appended args and capabilities")
	}
	// One operation a line, as a person would write it.
	var buf bytes.Buffer
	buf.WriteString("[\n")
	for i, op := range ops {
		line, err := json.Marshal(op)
		if err != nil {
			return nil, err
		}
		buf.WriteString(" ")
		buf.Write(line)
		if i < len(ops)-1 {
			buf.WriteString(",")
		}
		buf.WriteString("\n")
	}
	buf.WriteString("]\n")
	return buf.Bytes(), nil
}

// take removes the list at ptr from obj and returns it (nil when absent).
func take(obj map[string]any, ptr []string) []any {
	var cur any = obj
	for i, k := range ptr {
		last := i == len(ptr)-1
		switch m := cur.(type) {
		case map[string]any:
			if last {
				l, _ := m[k].([]any)
				delete(m, k)
				return l
			}
			cur = m[k]
		case []any:
			var idx int
			if _, err := fmt.Sscan(k, &idx); err != nil || idx >= len(m) {
				return nil
			}
			cur = m[idx]
		default:
			return nil
		}
	}
	return nil
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// isHandKept reports whether rel (relative to manifests/) is kept by hand.
func isHandKept(rel string) bool { return slices.Contains(handKept, rel) }
