package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/steelyard-net/steelyard/controller"
)

// --detect-local-mode: how the agent tells pod traffic (left alone) from
// traffic of other sources (masqueraded on its way to a VIP), with
// kube-proxy's names and meaning for the two modes that need no interface
// names.
const (
	// DetectClusterCIDR: sources inside --cluster-cidr are local; without
	// the flag, the clusterCIDR of a kubeadm-style kube-proxy ConfigMap
	// (kube-system/kube-proxy, key config.conf) when there is one and the
	// agent may read it; else none (every source is left alone).
	DetectClusterCIDR = "ClusterCIDR"
	// DetectNodeCIDR: sources inside this node's spec.podCIDRs (node IPAM)
	// are local. The agent waits for them at start and exits when they
	// change, so that the DaemonSet restarts it on the new ones, as
	// kube-proxy does.
	DetectNodeCIDR = "NodeCIDR"
	// detectAuto ("" on the command line, the chart's default):
	// ClusterCIDR when a cluster CIDR is known (--cluster-cidr or
	// kube-proxy's ConfigMap), else NodeCIDR.
	detectAuto = ""
)

// kubeProxyConfigMap is where kubeadm keeps kube-proxy's configuration.
const (
	kubeProxyConfigNS   = "kube-system"
	kubeProxyConfigName = "kube-proxy"
	kubeProxyConfigKey  = "config.conf"
)

// podCIDRWait bounds the wait for node IPAM to give this Node its
// spec.podCIDRs (kube-proxy waits as long); the pod then restarts.
const podCIDRWait = 5 * time.Minute

var logLocal = logrus.WithField("subsys", "local-detect")

// errPodCIDRsChanged ends the agent when its Node's pod ranges change under
// NodeCIDR: the masquerade rules were built on the old ones.
var errPodCIDRsChanged = errors.New("this node's spec.podCIDRs changed (--detect-local-mode=NodeCIDR): exiting to restart on the new ones")

// localTraffic is what --detect-local-mode resolved to.
type localTraffic struct {
	// Mode is ClusterCIDR or NodeCIDR.
	Mode string
	// CIDRs are the local sources (none: nothing is masqueraded by source).
	CIDRs []netip.Prefix
	// From says where CIDRs came from, for the log.
	From string
}

// strings returns the CIDRs as --cluster-cidr values.
func (l localTraffic) strings() []string {
	out := make([]string, len(l.CIDRs))
	for i, c := range l.CIDRs {
		out[i] = c.String()
	}
	return out
}

// checkDetectLocalMode rejects an unknown mode and NodeCIDR without an
// API server (the manifests source has no Node), before anything is
// written.
func checkDetectLocalMode(mode, manifests string) error {
	switch mode {
	case detectAuto, DetectClusterCIDR:
		return nil
	case DetectNodeCIDR:
		if manifests != "" {
			return fmt.Errorf("--detect-local-mode=%s needs the API server (this node's spec.podCIDRs): not with --manifests", mode)
		}
		return nil
	}
	return fmt.Errorf("--detect-local-mode %q: want %s or %s (or empty: %s when a cluster CIDR is known, else %s)",
		mode, DetectClusterCIDR, DetectNodeCIDR, DetectClusterCIDR, DetectNodeCIDR)
}

// detectLocal resolves mode into the local sources. flagCIDRs is
// --cluster-cidr; client is nil with --manifests (then only the flag
// counts). It waits up to wait for this Node's spec.podCIDRs under
// NodeCIDR.
func detectLocal(ctx context.Context, client kubernetes.Interface, mode string, flagCIDRs []string, nodeName string, wait time.Duration) (localTraffic, error) {
	flagged, err := parseCIDRs(flagCIDRs)
	if err != nil {
		return localTraffic{}, fmt.Errorf("--cluster-cidr: %w", err)
	}
	if mode != DetectNodeCIDR {
		if len(flagged) > 0 || client == nil {
			return localTraffic{Mode: DetectClusterCIDR, CIDRs: flagged, From: "--cluster-cidr"}, nil
		}
		cidrs, err := kubeProxyClusterCIDR(ctx, client, wait)
		if err != nil {
			return localTraffic{}, err
		}
		if len(cidrs) > 0 || mode == DetectClusterCIDR {
			return localTraffic{Mode: DetectClusterCIDR, CIDRs: cidrs, From: "ConfigMap " + kubeProxyConfigNS + "/" + kubeProxyConfigName}, nil
		}
	}
	if client == nil {
		return localTraffic{}, fmt.Errorf("--detect-local-mode=%s needs the API server", DetectNodeCIDR)
	}
	cidrs, err := waitPodCIDRs(ctx, client, nodeName, wait)
	if err != nil {
		return localTraffic{}, err
	}
	return localTraffic{Mode: DetectNodeCIDR, CIDRs: cidrs, From: "Node " + nodeName + " spec.podCIDRs"}, nil
}

// kubeProxyClusterCIDR reads clusterCIDR from kube-proxy's ConfigMap. A
// missing ConfigMap, key or value, or one the agent may not read, is none;
// a value that does not parse is an error (a cluster CIDR was meant).
// Other API errors (the API server not up yet) are retried for up to wait.
func kubeProxyClusterCIDR(ctx context.Context, client kubernetes.Interface, wait time.Duration) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var cm *corev1.ConfigMap
	for {
		var err error
		cm, err = client.CoreV1().ConfigMaps(kubeProxyConfigNS).Get(ctx, kubeProxyConfigName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			logLocal.Debug("no kube-proxy ConfigMap")
			return nil, nil
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			logLocal.WithError(err).Info("cannot read the kube-proxy ConfigMap; no cluster CIDR from it")
			return nil, nil
		case err == nil:
		default:
			logLocal.WithError(err).Info("reading the kube-proxy ConfigMap; retrying")
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", kubeProxyConfigNS, kubeProxyConfigName, err)
			case <-time.After(time.Second):
			}
			continue
		}
		break
	}
	var conf struct {
		ClusterCIDR string `json:"clusterCIDR"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data[kubeProxyConfigKey]), &conf); err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s key %s: %w", kubeProxyConfigNS, kubeProxyConfigName, kubeProxyConfigKey, err)
	}
	cidrs, err := parseCIDRs(strings.Split(conf.ClusterCIDR, ","))
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s clusterCIDR: %w", kubeProxyConfigNS, kubeProxyConfigName, err)
	}
	return cidrs, nil
}

// waitPodCIDRs returns the Node's spec.podCIDRs (spec.podCIDR on servers
// that set only that), polling until node IPAM has set them or wait ends.
func waitPodCIDRs(ctx context.Context, client kubernetes.Interface, name string, wait time.Duration) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	last, logged := "", time.Time{}
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			cidrs, perr := controller.PodCIDRs(n)
			if perr != nil {
				return nil, perr
			}
			if len(cidrs) > 0 {
				return cidrs, nil
			}
			last = "no spec.podCIDRs yet"
		} else {
			last = err.Error()
		}
		if time.Since(logged) > 10*time.Second {
			logLocal.WithField("node", name).WithField("last", last).Info("waiting for this node's spec.podCIDRs (--detect-local-mode=NodeCIDR)")
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("--detect-local-mode=%s: Node %q has no spec.podCIDRs after %v (%s): does kube-controller-manager allocate node CIDRs (--allocate-node-cidrs)? Else set --cluster-cidr", DetectNodeCIDR, name, wait, last)
		case <-time.After(time.Second):
		}
	}
}

// parseCIDRs parses CIDRs (empty values skipped), masked, without repeats.
func parseCIDRs(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, err
		}
		if p = p.Masked(); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// podCIDRsChanged returns, under NodeCIDR, the check that the Node watch
// runs on each change of this Node: it ends the agent (restart, the error
// errPodCIDRsChanged) once spec.podCIDRs are known and differ from the
// ones the rules were built on. Under ClusterCIDR it returns nil.
func (l localTraffic) podCIDRsChanged(restart context.CancelCauseFunc) func([]netip.Prefix) {
	if l.Mode != DetectNodeCIDR {
		return nil
	}
	return func(now []netip.Prefix) {
		if len(now) == 0 || slices.Equal(now, l.CIDRs) {
			return
		}
		logLocal.WithField("was", l.CIDRs).WithField("now", now).Error(errPodCIDRsChanged.Error())
		restart(errPodCIDRsChanged)
	}
}

// resolveLocalTraffic runs detectLocal for run (with the API server unless
// manifests is set), logs the outcome and puts the CIDRs into
// dp.clusterCIDRs, which the dataplane's masquerade rules are built on.
func resolveLocalTraffic(ctx context.Context, dp *dataplaneFlags, mode, manifests, kubeconfig, nodeName string) (localTraffic, error) {
	if err := checkDetectLocalMode(mode, manifests); err != nil {
		return localTraffic{}, err
	}
	var client kubernetes.Interface
	if manifests == "" {
		c, err := newClient(kubeconfig)
		if err != nil {
			return localTraffic{}, err
		}
		client = c
	}
	l, err := detectLocal(ctx, client, mode, dp.clusterCIDRs, nodeName, podCIDRWait)
	if err != nil {
		return localTraffic{}, err
	}
	logLocal.WithFields(logrus.Fields{"mode": l.Mode, "cidrs": l.CIDRs, "from": l.From}).Info("local traffic detection")
	dp.clusterCIDRs = l.strings()
	return l, nil
}
