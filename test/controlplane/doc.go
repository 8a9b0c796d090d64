// Package controlplane runs a real Kubernetes control plane, etcd and
// kube-apiserver, for tests and benchmarks (issue 3). There is no
// kube-controller-manager, scheduler or kubelet: Services get their
// ClusterIP (the apiserver allocates it) but no EndpointSlices, so tests
// create the EndpointSlices themselves, and Namespaces never finish
// deleting (each control plane starts from fresh etcd data instead).
//
// The binaries are built from source by scripts/control-plane/build.sh
// (`make control-plane`) and cached by version under
// $HOME/.cache/steelyard; FindBinaries explains what to run when they are
// missing.
//
// Both processes listen on 127.0.0.1 only, on ports picked at run time,
// and nothing here touches the machine's network configuration. Each
// control plane lives in its own temporary directory (etcd data, certs,
// keys, kubeconfigs, logs), removed by Stop. kube-apiserver is stopped
// before etcd, with SIGKILL after a grace period, and both die with the
// test binary even when it is killed (see spawn); the next start removes
// the directories that dead test binaries left behind.
//
// What kube-apiserver is given:
//
//	--etcd-servers                  the private etcd
//	--bind-address, --advertise-address
//	                                127.0.0.1; --endpoint-reconciler-type=none,
//	                                without which a loopback advertise
//	                                address makes it exit
//	--cert-dir                      it self-signs its serving certificate
//	                                there; the file holds the signing CA too,
//	                                and kubeconfigs use it as their CA
//	--service-account-*             an RSA key generated here, issuer
//	                                https://kubernetes.default.svc
//	--service-cluster-ip-range      198.18.0.0/16 (ServiceCIDR)
//	--token-auth-file               one admin token, group system:masters
//	--authorization-mode=RBAC       so a ServiceAccount's rights come only
//	                                from the roles bound to it
package controlplane
