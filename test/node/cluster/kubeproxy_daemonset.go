package cluster

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/steelyard-net/steelyard/test/controlplane"
)

// KubeProxyImage is the kube-proxy image scripts/node/images.sh builds
// (the control plane's kube-proxy on the steelyard rootfs) as
// kube-proxy.tar in the images set. It is not imported with the node's
// images: a test that runs kube-proxy as a DaemonSet imports it
// (Cluster.ImportImage with KubeProxyImageTar).
const KubeProxyImage = "registry.k8s.io/kube-proxy:v1.37.2"

// KubeProxyImageTar is the kube-proxy image's tarball in the images set.
func KubeProxyImageTar() (string, error) {
	cache, err := controlplane.CacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(envOr(EnvImagesDir, filepath.Join(cache, "images")), "kube-proxy.tar"), nil
}

// The node labels of the migration between kube-proxy and steelyard
// (docs/cluster.md#from-kube-proxy-to-steelyard): steelyard's DaemonSet
// runs where LabelRunSteelyard is "true" (its nodeSelector during the
// migration), kube-proxy's leaves the nodes where LabelRunKubeProxy is
// "false" (a NotIn node affinity, so no node needs a label beforehand).
const (
	LabelRunSteelyard = "steelyard.io/steelyard"
	LabelRunKubeProxy = "steelyard.io/kube-proxy"
)

// KubeProxyManifests is kube-proxy as kubeadm installs it, in mode
// ("iptables" or "nftables"): a ServiceAccount bound to the
// system:node-proxier ClusterRole, its configuration in the ConfigMap
// kube-system/kube-proxy (key config.conf, which steelyard reads for the
// cluster CIDR) and a DaemonSet of KubeProxyImage in the node's network
// namespace. It differs from kubeadm's where this box needs it: the API
// server's address comes in KUBERNETES_SERVICE_HOST/PORT (apiHost,
// apiPort) instead of a kubeconfig, the container is not privileged
// (NET_ADMIN and NET_RAW, as steelyard's: a privileged container could
// write the machine's global sysctls), so localhostNodePorts is off (it
// needs route_localnet, in the container's read-only /proc/sys) and the
// conntrack settings are zero (kube-proxy then leaves the host-wide
// nf_conntrack_max alone). Like kubeadm's, the DaemonSet runs on every
// node: the migration's first step is KubeProxyAffinityPatch.
func KubeProxyManifests(mode, apiHost string, apiPort int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeadm:node-proxier"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: kube-proxy, namespace: kube-system, labels: {app: kube-proxy}}
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    mode: %[1]s
    clusterCIDR: %[2]s
    iptables:
      localhostNodePorts: false
    conntrack:
      maxPerCore: 0
      min: 0
      tcpEstablishedTimeout: 0s
      tcpCloseWaitTimeout: 0s
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {k8s-app: kube-proxy}
spec:
  selector: {matchLabels: {k8s-app: kube-proxy}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {k8s-app: kube-proxy}}
    spec:
      serviceAccountName: kube-proxy
      hostNetwork: true
      priorityClassName: system-node-critical
      tolerations: [{operator: Exists}]
      nodeSelector: {kubernetes.io/os: linux}
      terminationGracePeriodSeconds: 5
      containers:
      - name: kube-proxy
        image: %[3]s
        imagePullPolicy: IfNotPresent
        command: [/usr/local/bin/kube-proxy, --config=/var/lib/kube-proxy/config.conf, --hostname-override=$(NODE_NAME), --v=1]
        env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        - {name: KUBERNETES_SERVICE_HOST, value: %[4]q}
        - {name: KUBERNETES_SERVICE_PORT, value: "%[5]d"}
        securityContext:
          privileged: false
          capabilities: {add: [NET_ADMIN, NET_RAW]}
        volumeMounts:
        - {name: kube-proxy, mountPath: /var/lib/kube-proxy}
        - {name: xtables-lock, mountPath: /run/xtables.lock}
        - {name: lib-modules, mountPath: /lib/modules, readOnly: true}
      volumes:
      - {name: kube-proxy, configMap: {name: kube-proxy}}
      - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
      - {name: lib-modules, hostPath: {path: /lib/modules}}
`, mode, PodCIDR, KubeProxyImage, apiHost, apiPort)
}

// KubeProxyAffinityPatch is the migration's first step: a strategic merge
// patch of kube-proxy's DaemonSet that keeps it off the nodes labelled
// LabelRunKubeProxy=false (`kubectl -n kube-system patch ds kube-proxy -p
// ...`; it rolls kube-proxy's pods once, one node at a time).
const KubeProxyAffinityPatch = `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"` + LabelRunKubeProxy + `","operator":"NotIn","values":["false"]}]}]}}}}}}}`

// OneShotPod is a pod that runs argv once in node's network namespace
// (hostNetwork, NET_ADMIN and NET_RAW, the xtables lock) with image and
// stops: how an operator runs `kube-proxy --cleanup` or `steelyard
// cleanup` on one node without logging in to it.
func OneShotPod(name, namespace, node, image string, argv ...string) string {
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  nodeName: %s
  hostNetwork: true
  restartPolicy: Never
  automountServiceAccountToken: false
  tolerations: [{operator: Exists}]
  containers:
  - name: cleanup
    image: %s
    imagePullPolicy: IfNotPresent
    command: [%s]
    securityContext:
      privileged: false
      capabilities: {add: [NET_ADMIN, NET_RAW]}
    volumeMounts:
    - {name: xtables-lock, mountPath: /run/xtables.lock}
  volumes:
  - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
`, name, namespace, node, image, strings.Join(quoted, ", "))
}

// counters matches the packet and byte counters of iptables-save lines
// (":CHAIN ACCEPT [12:345]" and "[12:345] -A ..." with -c).
var counters = regexp.MustCompile(`\s*\[\d+:\d+\]\s*`)

// KubeRules returns the lines of iptables-save output that name a KUBE-
// chain (chain declarations and rules, counters stripped), each prefixed
// with its table, sorted: what kube-proxy's iptables and IPVS modes write,
// and kubelet's few chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY),
// which a caller tells apart by comparing with the node before kube-proxy
// ran.
func KubeRules(save string) []string {
	var out []string
	table := ""
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "*"):
			table = l[1:]
			continue
		case l == "" || strings.HasPrefix(l, "#") || l == "COMMIT":
			continue
		}
		if !strings.Contains(l, "KUBE-") {
			continue
		}
		out = append(out, table+": "+strings.TrimSpace(counters.ReplaceAllString(l, " ")))
	}
	sort.Strings(out)
	return out
}

// NFTTables returns the "family name" of each table in the output of
// `nft list tables`.
func NFTTables(list string) []string {
	var out []string
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "table" {
			out = append(out, f[1]+" "+f[2])
		}
	}
	return out
}

// KubeProxyTables are the tables kube-proxy's nftables mode creates.
func KubeProxyTables(tables []string) []string {
	var out []string
	for _, t := range tables {
		if strings.HasSuffix(t, " kube-proxy") {
			out = append(out, t)
		}
	}
	return out
}
