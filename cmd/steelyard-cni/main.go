// Command steelyard-cni is steelyard's chained CNI plugin: it runs after
// the cluster's main plugin for every pod. ADD turns on hairpin mode on the
// pod's bridge port (so a pod reaches itself through a VIP) and makes sure
// IPv4 forwarding is on; DEL deletes the conntrack entries still pointing
// at the pod's IPs (so UDP flows to a deleted pod move on at once); CHECK
// verifies ADD's work. It must be chained: used alone it fails with a clear
// error. See package cni for the details and the options.
//
// stdout carries only the CNI result (or a CNI error); informational lines
// go to stderr.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/steelyard-net/steelyard/cni"
)

// buildVersion is set at build time with -ldflags "-X main.buildVersion=...".
var buildVersion = "dev"

func main() {
	p := &cni.Plugin{Host: cni.KernelHost{}, Stdout: os.Stdout, Stderr: os.Stderr}
	skel.PluginMainFuncs(p.Funcs(), version.PluginSupports(cni.SupportedVersions...), "CNI plugin steelyard-cni "+buildVersion)
}
