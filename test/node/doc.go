// Package node is the real-node suite (build tag node, `make node`): one
// Kubernetes node in a box (test/node/cluster: kubelet, containerd, the
// real kube-controller-manager and kube-scheduler, v1.37.2), steelyard
// installed from manifests/ with kubectl as a user does, real pods of
// agnhost, and traffic from a real client pod's network namespace (the
// test opens /proc/<pid>/ns/net of the pod's container and dials from
// there) or from a client namespace outside the node.
package node
