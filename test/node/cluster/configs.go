package cluster

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
)

// The cluster's address plan (see the package comment).
var (
	// PodCIDR is the pods' range: the bridge plugin's host-local subnet
	// on a one-node cluster; with several nodes, the --cluster-cidr node
	// IPAM cuts each node's /24 from (NodeCIDRMaskSize).
	PodCIDR = netip.MustParsePrefix("198.19.64.0/18")
	// PodGateway is the one node's address on the pod bridge (with
	// several nodes, the first address of each node's range).
	PodGateway = netip.MustParseAddr("198.19.64.1")
)

// PauseImage is the sandbox image: kubelet v1.37's default (and the e2e
// suite's), built here by scripts/node/images.sh.
const PauseImage = "registry.k8s.io/pause:3.10.2"

// AgnhostImage is the e2e suite's test server image at v1.37.2.
const AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"

// NetexecPreStopSeconds is NetexecPodSpec's preStop pause: its pods are
// torn down (process, sandbox, network namespace) this long after the
// scale-down that removed them.
const NetexecPreStopSeconds = 5 // = the sleep in NetexecPodSpec (TestNetexecPreStop)

// NetexecPodSpec is the pod spec (YAML, indented for a Deployment's or
// StatefulSet's template.spec) of the real-node suites' backends: agnhost's
// HTTP server, whose /hostname answers the pod's name, ready once it
// answers, and with what users run: a pause before SIGTERM, so the endpoint
// has left every node's rules before the process stops accepting.
const NetexecPodSpec = `
      terminationGracePeriodSeconds: 30
      containers:
      - name: netexec
        image: ` + AgnhostImage + `
        imagePullPolicy: IfNotPresent
        args: ["netexec", "--http-port=8080"]
        ports: [{containerPort: 8080}]
        readinessProbe:
          httpGet: {path: /hostname, port: 8080}
          periodSeconds: 1
        lifecycle:
          preStop:
            sleep: {seconds: 5}
`

// SteelyardImage is the image manifests/30-daemonset.yaml names.
const SteelyardImage = "ghcr.io/steelyard-net/steelyard:latest"

// BridgeName is the pod bridge the main CNI plugin makes in the node
// namespace.
const BridgeName = "cni0"

// MainConflist is the node's CNI configuration before steelyard's
// install-cni chains steelyard-cni into it.
const MainConflist = "10-bridge.conflist"

// mainConflist is the bridge plugin with host-local on subnet, the node's
// address on the bridge gateway.
func mainConflist(hairpin bool, subnet netip.Prefix, gateway netip.Addr) string {
	return bridgeConflist(hairpin, []netip.Prefix{subnet}, []netip.Addr{gateway})
}

// mainConflistRanges is mainConflist with one host-local range per prefix
// (a dual-stack node has an IPv4 and an IPv6 one), each with its first
// address as the gateway (the node's address on the bridge) and a default
// route of its family: the bridge plugin then gives every pod an address
// of each family and turns on forwarding for both.
func mainConflistRanges(hairpin bool, subnets []netip.Prefix) string {
	gateways := make([]netip.Addr, len(subnets))
	for i, s := range subnets {
		gateways[i] = s.Addr().Next()
	}
	return bridgeConflist(hairpin, subnets, gateways)
}

func bridgeConflist(hairpin bool, subnets []netip.Prefix, gateways []netip.Addr) string {
	var ranges, routes []string
	for i, s := range subnets {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet": %q, "gateway": %q}]`, s.String(), gateways[i].String()))
		dst := "0.0.0.0/0"
		if s.Addr().Is6() {
			dst = "::/0"
		}
		routes = append(routes, fmt.Sprintf(`{"dst": %q}`, dst))
	}
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": %t,
      "ipam": {
        "type": "host-local",
        "ranges": [%s],
        "routes": [%s]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, BridgeName, hairpin, strings.Join(ranges, ", "), strings.Join(routes, ", "))
}

// containerdConfig is containerd's config.toml (version 3, containerd 2.x):
// root, state, sockets and runc's state under dir; the CRI's sandbox image
// is our pause; CNI from the bind-mounted /opt/cni/bin and /etc/cni/net.d.
func containerdConfig(dir, shimDir, runc string) string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins.'io.containerd.internal.v1.opt']
  path = %[5]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[6]q

[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE (this kind of machine) a process cannot lower
  # its oom_score_adj, and kubelet asks -998 for every pod sandbox: runc
  # then fails with "can't get final child's PID from pipe: EOF". Clamp
  # to containerd's own score instead.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[7]q
        Root = %[8]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"),
		filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "containerd.sock.ttrpc"),
		filepath.Join(dir, "opt"), PauseImage, runc, filepath.Join(dir, "runc"))
}

// kubeletConfig is kubelet's KubeletConfiguration.
//
//   - failCgroupV1: false: this machine is cgroup v1 (hybrid), which kubelet
//     1.35+ refuses by default.
//   - cgroupfs driver (no systemd as PID 1), cgroupRoot our own cgroup.
//   - the image GC and disk evictions off: the images cannot be pulled
//     again, and the host's disk use is not the test's business.
//   - anonymous access with AlwaysAllow on 198.19.0.1:10250 only (inside
//     the node namespace): kube-apiserver reaches it for exec and logs
//     through the egress proxy and has no client certificate.
func kubeletConfig(cgroupRoot, containerdSock, resolvConf, podLogs string, nodeIP netip.Addr) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %q
cgroupsPerQOS: true
containerRuntimeEndpoint: %q
address: %q
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
resolvConf: %q
podLogsDir: %q
failSwapOn: false
protectKernelDefaults: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
serializeImagePulls: false
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
shutdownGracePeriod: 0s
`, cgroupRoot, "unix://"+containerdSock, nodeIP.String(), resolvConf, podLogs)
}

// egressSelectorConfig sends kube-apiserver's traffic to the cluster
// (kubelet, pods) through the HTTP CONNECT proxy on the unix socket sock.
func egressSelectorConfig(sock string) string {
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: "` + sock + `"
`
}

// Controllers are the kube-controller-manager controllers the node runs:
// what Services, ServiceAccounts and the workload kinds need, nothing
// about cloud or IPAM (the one node's host-local has the pod range; a
// multi-node cluster adds NodeIPAMController).
var Controllers = []string{
	"endpointslice-controller",
	"endpointslice-mirroring-controller",
	"serviceaccount-token-controller",
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"namespace-controller",
	"garbage-collector-controller",
	"deployment-controller",
	"replicaset-controller",
	"statefulset-controller",
	"daemonset-controller",
	"pod-garbage-collector-controller",
	// Takes the not-ready taint kubelet registers the Node with off.
	"node-lifecycle-controller",
}

// NodeIPAMController is the controller that gives each Node a pod range
// (spec.podCIDRs) from --cluster-cidr.
const NodeIPAMController = "node-ipam-controller"

func controllersFlag(extra ...string) string {
	return "--controllers=" + strings.Join(append(append([]string(nil), Controllers...), extra...), ",")
}
