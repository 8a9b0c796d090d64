// Command steelyard-chart renders, checks, lints and packages the Helm
// chart charts/steelyard with the Helm v4 library (no helm binary):
//
//	steelyard-chart render  -chart charts/steelyard -out manifests
//	steelyard-chart check   -chart charts/steelyard -manifests manifests
//	steelyard-chart package -chart charts/steelyard -version $(VERSION) -out bin
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
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	chartDir := fs.String("chart", "charts/steelyard", "the chart's directory")
	version := fs.String("version", "", "the build's VERSION (git describe): appVersion, and the chart version in SemVer form")
	out := fs.String("out", "", "render: the manifests/ directory to write; package: the directory of the .tgz")
	manifests := fs.String("manifests", "manifests", "check: the committed manifests/")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "render":
		err = cmdRender(*chartDir, *out)
	case "check":
		err = cmdCheck(*chartDir, *manifests)
	case "lint":
		err = Lint(*chartDir)
	case "package":
		err = cmdPackage(*chartDir, *version, *out)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "steelyard-chart "+os.Args[1]+": "+err.Error())
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: steelyard-chart render|check|lint|package [-chart DIR] [-out DIR] [-manifests DIR] [-version V]")
	os.Exit(2)
}
