package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/strvals"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// setFlags collects repeated -set key=value (helm's --set syntax).
type setFlags []string

func (s *setFlags) String() string     { return strings.Join(*s, ",") }
func (s *setFlags) Set(v string) error { *s = append(*s, v); return nil }

// values parses the -set flags as helm --set does.
func (s setFlags) values() (map[string]any, error) {
	vals := map[string]any{}
	for _, kv := range s {
		if err := strvals.ParseInto(kv, vals); err != nil {
			return nil, fmt.Errorf("-set %s: %w", kv, err)
		}
	}
	return vals, nil
}

// release is what install and upgrade act on: a release name, the
// namespace that stores it (not the chart's objects': those go to
// namespace.name), and the cluster.
type releaseTarget struct {
	kubeconfig, name, namespace string
	timeout                     time.Duration
}

// config is Helm's action configuration for t (release records as Secrets,
// as the helm CLI keeps them).
func (t releaseTarget) config() (*action.Configuration, error) {
	if t.kubeconfig == "" {
		return nil, errors.New("-kubeconfig is required")
	}
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &t.kubeconfig
	flags.Namespace = &t.namespace
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.NewTextHandler(io.Discard, nil)))
	if err := cfg.Init(flags, t.namespace, "secret"); err != nil {
		return nil, err
	}
	return cfg, nil
}

// releaseFunc is one Helm action on release t: install or upgrade.
type releaseFunc func(cfg *action.Configuration, chartDir, version string, t releaseTarget, set setFlags) (release.Releaser, error)

// cmdRelease runs do (install or upgrade, both --wait) and prints the
// release it made.
func cmdRelease(do releaseFunc, chartDir, version string, t releaseTarget, set setFlags) error {
	cfg, err := t.config()
	if err != nil {
		return err
	}
	rel, err := do(cfg, chartDir, version, t, set)
	if err != nil {
		return err
	}
	return printRelease(rel)
}

// chartAndValues loads the chart in chartDir stamped with version and
// the -set values.
func chartAndValues(chartDir, version string, set setFlags) (*chart.Chart, map[string]any, error) {
	c, err := Load(chartDir, version)
	if err != nil {
		return nil, nil, err
	}
	vals, err := set.values()
	if err != nil {
		return nil, nil, err
	}
	return c, vals, nil
}

// install installs the chart in chartDir, stamped with version, as release
// t.name in t.namespace with the -set values, and waits for its objects.
func install(cfg *action.Configuration, chartDir, version string, t releaseTarget, set setFlags) (release.Releaser, error) {
	c, vals, err := chartAndValues(chartDir, version, set)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = t.name, t.namespace
	in.WaitStrategy, in.Timeout = kube.StatusWatcherStrategy, t.timeout
	rel, err := in.Run(c, vals)
	if err != nil {
		return nil, fmt.Errorf("install %s: %w", t.name, err)
	}
	return rel, nil
}

// upgrade upgrades release t.name to the chart in chartDir, keeping the
// values of the last release (--reuse-values) with the -set values over
// them, and waits for its objects.
func upgrade(cfg *action.Configuration, chartDir, version string, t releaseTarget, set setFlags) (release.Releaser, error) {
	c, vals, err := chartAndValues(chartDir, version, set)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.ReuseValues = t.namespace, true
	up.WaitStrategy, up.Timeout = kube.StatusWatcherStrategy, t.timeout
	rel, err := up.Run(t.name, c, vals)
	if err != nil {
		return nil, fmt.Errorf("upgrade %s: %w", t.name, err)
	}
	return rel, nil
}

// cmdUninstall is helm uninstall --wait.
func cmdUninstall(t releaseTarget) error {
	cfg, err := t.config()
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.WaitStrategy, un.Timeout = kube.StatusWatcherStrategy, t.timeout
	if _, err := un.Run(t.name); err != nil {
		return fmt.Errorf("uninstall %s: %w", t.name, err)
	}
	fmt.Printf("release %s uninstalled\n", t.name)
	return nil
}

// printRelease prints one line a test can read:
// "release NAME revision N status S chart VERSION app APPVERSION".
func printRelease(r release.Releaser) error {
	a, err := release.NewAccessor(r)
	if err != nil {
		return err
	}
	ch, err := chartMeta(a)
	if err != nil {
		return err
	}
	fmt.Printf("release %s revision %d status %s chart %s app %s\n", a.Name(), a.Version(), a.Status(), ch[0], ch[1])
	return nil
}

// chartMeta returns the released chart's version and appVersion.
func chartMeta(a release.Accessor) ([2]string, error) {
	ch, ok := a.Chart().(*chart.Chart)
	if !ok || ch.Metadata == nil {
		return [2]string{}, fmt.Errorf("release %s: unexpected chart type %T", a.Name(), a.Chart())
	}
	return [2]string{ch.Metadata.Version, ch.Metadata.AppVersion}, nil
}
