package ipvs

import (
	"net/netip"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// A Local port whose only local endpoint is terminating (LocalOnly: the
// controller keeps it for Local traffic while cluster traffic goes to a
// ready remote endpoint, kube-proxy's fallback per category): the external
// IP (policy Local) sends everything to it, the clusterIP (policy Cluster)
// to the remote one; each keeps the other at weight 0.
func TestLocalOnlyTerminatingEndpoint(t *testing.T) {
	k := newTestKernel(t)
	term := be("198.19.1.2:8080", 1)
	term.Local, term.LocalOnly, term.Ready, term.Serving, term.Terminating = true, true, false, true, true
	web := svc("web", "198.18.0.10", 80, dataplane.TCP, term, be("198.19.2.2:8080", 1))
	web.ExternalIPs = []netip.Addr{netip.MustParseAddr("198.18.1.10")}
	web.ExternalLocal = true
	k.sync(t, state(web), true)
	checkDump(t, k, "TCP 198.18.0.10:80 wrr\n  -> 198.19.1.2:8080 0\n  -> 198.19.2.2:8080 1\n"+
		"TCP 198.18.1.10:80 wrr\n  -> 198.19.1.2:8080 1\n  -> 198.19.2.2:8080 0\n")
}
