// Command steelyard-chart renders, checks, lints and packages the Helm
// chart charts/steelyard with the Helm v4 library (no helm binary):
//
//	steelyard-chart render  -chart charts/steelyard -out manifests
//	steelyard-chart template -chart charts/steelyard -set mode=ebpf -out DIR
//	steelyard-chart check   -chart charts/steelyard -manifests manifests
//	steelyard-chart package -chart charts/steelyard -version $(VERSION) -out bin
//	steelyard-chart install|upgrade -kubeconfig K -version $(VERSION) -set mode=nftables
//	steelyard-chart uninstall -kubeconfig K
//
// install, upgrade (with --reuse-values) and uninstall are helm's, with
// --wait, for the node suite (test/node/upgrade_test.go). template is helm
// template: the chart rendered with the -set values, one file a template,
// for a harness that applies them with kubectl (make conformance's
// steelyard-ebpf proxy, test/conformance/ebpf.go).
//
// manifests/ is the chart rendered with its default values (render);
// check lints the chart and fails when manifests/ differs from a fresh
// render. It is its own Go module so that Helm's dependencies stay out of
// the agent's.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	chartDir := fs.String("chart", "charts/steelyard", "the chart's directory")
	version := fs.String("version", "", "the build's VERSION (git describe): appVersion, and the chart version in SemVer form")
	out := fs.String("out", "", "render: the manifests/ directory to write; template: the directory of the rendered files; package: the directory of the .tgz")
	manifests := fs.String("manifests", "manifests", "check: the committed manifests/")
	var t releaseTarget
	var set setFlags
	fs.StringVar(&t.kubeconfig, "kubeconfig", "", "install, upgrade, uninstall: the cluster")
	fs.StringVar(&t.name, "release", "steelyard", "install, upgrade, uninstall: the release's name")
	fs.StringVar(&t.namespace, "release-namespace", "default", "install, upgrade, uninstall: the namespace of the release record (the chart's objects go to namespace.name)")
	fs.DurationVar(&t.timeout, "timeout", 3*time.Minute, "install, upgrade, uninstall: how long to wait for the objects")
	fs.Var(&set, "set", "install, upgrade, template: key=value as helm --set (repeatable)")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "render":
		err = cmdRender(*chartDir, *out)
	case "template":
		err = cmdTemplate(*chartDir, *version, *out, set)
	case "check":
		err = cmdCheck(*chartDir, *manifests)
	case "lint":
		err = Lint(*chartDir)
	case "package":
		err = cmdPackage(*chartDir, *version, *out)
	case "install":
		err = cmdRelease(install, *chartDir, *version, t, set)
	case "upgrade":
		err = cmdRelease(upgrade, *chartDir, *version, t, set)
	case "uninstall":
		err = cmdUninstall(t)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "steelyard-chart "+os.Args[1]+": "+err.Error())
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: steelyard-chart render|template|check|lint|package|install|upgrade|uninstall [flags] (-h for each)")
	os.Exit(2)
}
