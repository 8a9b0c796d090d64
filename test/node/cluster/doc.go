// Package cluster runs a Kubernetes cluster of one or more nodes in a box
// for the real-node suites (test/node) and for `make cluster-up`: etcd and
// kube-apiserver (test/controlplane), kube-controller-manager and
// kube-scheduler, containerd v2.3 with Debian's runc, and kubelet, all
// v1.37.2 and built from source; no kube-proxy anywhere (steelyard, applied
// from manifests/, implements Services).
//
// # Where things run
//
// Nothing changes the machine's root network namespace.
//
//	root netns, 127.0.0.1   etcd, kube-apiserver (advertised as the node's
//	                        198.19.0.1), kube-controller-manager,
//	                        kube-scheduler, and the egress proxy that
//	                        kube-apiserver reaches kubelet through
//	                        (kubectl exec/logs): an HTTP CONNECT proxy whose
//	                        dials happen inside the node namespace
//	node netns (sandbox)    containerd, kubelet, every pod; 198.19.0.1 is
//	                        the node's InternalIP; kube-apiserver's port is
//	                        relayed there (sandbox.NS.Forward), so the
//	                        kubernetes Service's endpoint 198.19.0.1:<port>
//	                        works from the node and from pods
//	client netns            "outside the node" (NodePort tests), on the
//	                        sandbox's client LAN 198.19.254.0/24
//
// Pods get 198.19.64.0/18 from the reference bridge + host-local + portmap
// plugins (conflist written by the harness; steelyard's install-cni chains
// steelyard-cni into it); Services 198.18.0.0/16.
//
// containerd and kubelet are started with `nsenter --net --mount` (not `ip
// netns exec`, which remounts /sys and hides the cgroup hierarchies): the
// mount namespace is a private one the harness makes, in which /run,
// /var/lib, /var/log and /opt are fresh tmpfs mounts and /opt/cni/bin and
// /etc/cni/net.d are bind mounts of directories under the cluster's Dir. So
// every mount kubelet, containerd and the CNI plugins make (container
// rootfs, pod network namespace files, secret volumes, shim sockets) lives
// in that namespace and disappears with it, and the DaemonSet's hostPath
// volumes resolve to the harness's directories. The one change to the
// machine's file tree is an empty /etc/cni/net.d mount point, created when
// missing and removed at teardown.
//
// # Several nodes (Options.Nodes > 1)
//
// Each node is the one node above, again: a network namespace, a private
// mount namespace, a cgroup steelyard-node-<pid>-<x>/<node name>, its own
// containerd (root, state, sockets under Dir/nodes/<name>) and kubelet
// (root dir, config, kubelet cgroupRoot its cgroup), and the API server's
// port relayed in its namespace. The nodes share a node LAN in a namespace
// of its own (lan.go: a bridge there, nodes at 198.19.0.1-N, which stay
// the InternalIPs; the egress proxy dials from there). kube-controller-
// manager runs node IPAM (--allocate-node-cidrs, --cluster-cidr PodCIDR,
// a /24 per node; a one-node cluster's node gets all of PodCIDR, so that
// steelyard finds its pod range there too); the harness writes each node's conflist once its Node
// has spec.podCIDRs, and routes every node's range via its LAN address on
// the other nodes, as a routed CNI setup would. kubelet labels the nodes
// topology.kubernetes.io/zone zone-a, zone-b, zone-c (round robin).
//
// Options.DualStack (several nodes) adds an IPv6 twin of every range from
// 2001:2::/48 (dualstack.go): Services, pods (a /64 per node from node
// IPAM), the node LAN (kubelet --node-ip gets both addresses); IPv6
// forwarding and routes in the node namespaces only.
//
// containerd (with its shims and containers) and kubelet run in a cgroup of
// their own, steelyard-node-<pid>, in every hierarchy; kubelet's cgroupRoot
// is the same cgroup, so pods land under it too. Teardown SIGKILLs every
// process in that tree and removes it. The host-wide sysctls kubelet writes
// are recorded before it starts and restored at teardown.
//
// Orphans of a test binary that was killed (SIGKILL, `go test -timeout`)
// are removed by the next Start: their directories, cgroups and mounts are
// recognised by the dead owner's PID in their names.
package cluster
