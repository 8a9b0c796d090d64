// Command coredns is CoreDNS with only the plugins the conformance node's
// cluster DNS uses (scripts/conformance/images.sh builds it into the
// image test/conformance installs as kube-dns). A wrapper module: the
// CoreDNS version is the one go.mod requires; not part of steelyard.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins above, in CoreDNS's own order (core/dnsserver/zdirectives.go).
var directives = []string{"errors", "log", "health", "ready", "cache", "loadbalance", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
