// Package k8s runs the steelyard agent against a real kube-apiserver and
// etcd (test/controlplane) while it programs a real kernel in a sandbox of
// network namespaces (test/sandbox), and measures what happens: weighted
// shares of objects created through the API, endpoint churn under load, an
// API server outage, SIGKILLs in the middle of syncs, bad annotations and
// their Events, --service-proxy-name selection, and the RBAC of manifests/.
//
// The tests carry the build tag k8s and need root and the control-plane
// binaries (`make control-plane`); they fail, never skip, without them:
//
//	make control-plane build
//	sudo STEELYARD_BIN=$PWD/bin/steelyard go test -tags k8s -count=1 -v ./test/k8s/
//
// TestMain builds cmd/steelyard once unless $STEELYARD_BIN names a binary.
// $STEELYARD_MODE (iptables by default, or nftables) is the --mode of every
// agent and CLI command; `make k8s` runs the whole suite in both.
//
// Each test starts its own control plane (fresh etcd data) and sandbox. The
// API server listens on 127.0.0.1 of the test's own network namespace; the
// agent runs in the sandbox's node namespace and reaches it through
// sandbox.NS.Forward, a relay listening on 127.0.0.1:<the same port> inside
// the node namespace, so the control plane's kubeconfigs work unchanged
// there. Nothing is changed in the machine's root network namespace.
//
// The churn and kill tests run alone (they measure latencies and load the
// machine); the others run in parallel after them, the 30 s API server
// outage beside the short ones.
//
// There is no kube-controller-manager: the tests create EndpointSlices
// themselves (managed-by steelyard-test) and give Services explicit
// clusterIPs.
//
// Test IP plan (on top of the sandbox's, see test/sandbox; 198.18.0.0/16 is
// also the API server's service-cluster-ip-range):
//
//	198.18.0.10:80   web        weights a/b            198.19.1.2 a, 198.19.1.3 b
//	198.18.0.20:80   churn      5 <-> 7 endpoints      198.19.2.2-8 c1..c7
//	198.18.0.30:80   outage     30/70                  198.19.3.2 o1, 198.19.3.3 o2
//	198.18.0.40:80   echo       1/1 (kill test)        198.19.4.2 e1, 198.19.4.3 e2
//	198.18.1.1-      bulk-000.. 300 Services, 3 endpoints each (kill test),
//	198.18.2.50                 198.19.64.1- (no pods: rules only)
//	198.18.0.50:80   good       25/75                  198.19.5.2 g1, 198.19.5.3 g2
//	198.18.0.51:80   bad        "a=ten"                the same pods
//	198.18.0.60:80   labelled   proxy-name steelyard   198.19.6.2 p1
//	198.18.0.61:80   unlabelled                        the same pod
//	198.18.0.62:80   other      proxy-name kube-proxy-other, the same pod
//	198.18.0.70:80   rbac-web   20/80                  198.19.7.2 r1, 198.19.7.3 r2
//	198.18.0.71:80   rbac-bad   "r1=ten"               the same pods
//	198.19.254.2     the client
package k8s
