package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/bombsimon/logrusr/v4"
	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/controller/runner"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/conntrack"
	"github.com/steelyard-net/steelyard/internal/execx"
)

var log = logrus.WithField("subsys", "main")

// dataplaneFlags select and configure the dataplane; run, explain, verify
// and cleanup share them.
type dataplaneFlags struct {
	mode          string
	iptablesMode  string
	clusterCIDRs  []string
	masqueradeAll bool
	masqueradeBit int
	// IPVS mode (ipvs.go).
	ipvsScheduler      string
	ipvsGracefulPeriod time.Duration
	// sysctlDir is where the node's sysctls are written (--sysctl-dir).
	sysctlDir string
	// localhostNodePorts is --localhost-nodeports (localhost.go).
	localhostNodePorts bool
	// countConnections is --count-connections (issue 23): the kernel
	// counts each endpoint's new connections (IPVS always does).
	countConnections bool
	// ebpf holds --mode ebpf's flags (ebpf.go).
	ebpf ebpfFlags
	// conntrack holds the --conntrack-tcp-timeout-* flags (conntrack.go).
	conntrack conntrackTimeouts
}

// The environment variables that give --mode and --iptables-mode their
// defaults. The chart's DaemonSet sets both to the agent's values: an
// operator's "kubectl exec ds/steelyard -- steelyard verify" on an
// nftables node then checks the nftables table, not iptables rules the
// agent never wrote (issue 20: both multi-node suites tripped on it).
const (
	envMode         = "STEELYARD_MODE"
	envIPTablesMode = "STEELYARD_IPTABLES_MODE"
)

// envDefault is $name when set and not empty, else def.
func envDefault(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func (f *dataplaneFlags) register(cmd *cobra.Command, withConfig bool) {
	cmd.Flags().StringVar(&f.mode, "mode", envDefault(envMode, "iptables"), "dataplane: "+modeNames()+" (default from $"+envMode+" when set: the DaemonSet sets it to the agent's mode, so explain and verify in its pod read the mode the agent writes)")
	cmd.Flags().StringVar(&f.iptablesMode, "iptables-mode", envDefault(envIPTablesMode, "auto"), "iptables flavour: auto (the one the host uses), nft or legacy (default from $"+envIPTablesMode+" when set)")
	f.registerEBPF(cmd)
	if withConfig {
		cmd.Flags().StringSliceVar(&f.clusterCIDRs, "cluster-cidr", nil, "pod CIDRs; new connections to a VIP from outside them are masqueraded")
		cmd.Flags().BoolVar(&f.masqueradeAll, "masquerade-all", false, "masquerade every new connection to a VIP")
		cmd.Flags().IntVar(&f.masqueradeBit, "masquerade-bit", dataplane.DefaultMasqueradeBit, "fwmark bit (0-31) that marks packets for masquerading")
		f.registerIPVS(cmd)
		cmd.Flags().BoolVar(&f.localhostNodePorts, "localhost-nodeports", true, "open node ports on 127.0.0.0/8 to the node's own processes (IPv4, iptables and nftables modes; sets net.ipv4.conf.all.route_localnet=1 and drops packets to 127.0.0.0/8 from other hosts), as kube-proxy's iptables mode does by default")
		cmd.Flags().BoolVar(&f.countConnections, "count-connections", false, "count each endpoint's new connections in the kernel (iptables: the packet counter of each endpoint's DNAT rule, always there; nftables: a counter per weight-map element; IPVS counts always; ebpf: a per-CPU counter per VIP and endpoint in the socket programs' map, plus the nftables counters), exported as steelyard_endpoint_new_connections_total beside steelyard_endpoint_weight and steelyard_endpoint_configured_ratio, and read by explain --observed; off by default for its cost at scale (docs/benchmarks.md)")
		// A container that is not privileged gets /proc/sys read-only;
		// the DaemonSet mounts the host's /proc/sys/net (per network
		// namespace, so the node's) at /host/proc/sys/net instead.
		cmd.Flags().DurationVar(&f.conntrack.established, "conntrack-tcp-timeout-established", 24*time.Hour, "the node's conntrack timeout of established TCP connections (net.netfilter.nf_conntrack_tcp_timeout_established), as kube-proxy sets it; 0: left as it is")
		cmd.Flags().DurationVar(&f.conntrack.closeWait, "conntrack-tcp-timeout-close-wait", time.Hour, "the node's conntrack timeout of TCP connections in CLOSE_WAIT (net.netfilter.nf_conntrack_tcp_timeout_close_wait), as kube-proxy sets it; 0: left as it is")
		cmd.Flags().StringVar(&f.sysctlDir, "sysctl-dir", dataplane.ProcSys, "where the node's sysctls are written (net.ipv4.ip_forward, route_localnet, IPVS's net.ipv4.vs.*): /proc/sys, or a writable mount of the host's /proc/sys/net at DIR/net")
	}
}

func newRunCommand() *cobra.Command {
	var (
		dp                   dataplaneFlags
		manifests            string
		kubeconfig           string
		nodeName             string
		proxyName            string
		metricsAddr          string
		kubeProxyAddr        string
		kubeProxyHealthzAddr string
		healthzAddr          string
		syncPeriod           time.Duration
		minSyncPeriod        time.Duration
		syncBurst            int
		fullSyncPeriod       time.Duration
		ing                  ingressFlags
		node                 nodeFlags
		gw                   gatewayFlags
		detectLocal          string
	)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node agent: program the kernel from Services and EndpointSlices",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneGC() // the agent only: the CLI commands keep Go's default
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// A change of this node's pod ranges under NodeCIDR ends the
			// run with errPodCIDRsChanged (the pod restarts).
			ctx, restart := context.WithCancelCause(ctx)
			defer restart(nil)
			// Flags are checked (the local sources found, the dataplane
			// opened, which writes nothing) before the first kernel
			// write: a bad flag changes nothing.
			local, err := resolveLocalTraffic(ctx, &dp, detectLocal, manifests, kubeconfig, nodeName)
			if err != nil {
				return err
			}
			node.onPodCIDRs = local.podCIDRsChanged(restart)
			addrs := &nodeAddressSource{}
			dp.localhostNodePorts = localhostNodePorts(&dp, &node)
			if err := checkLocalhostNodePorts(&dp, cmd.Flags().Changed("localhost-nodeports")); err != nil {
				return err
			}
			d, err := dp.open(addrs)
			if err != nil {
				return err
			}
			if err := gw.check(manifests); err != nil {
				return err
			}
			if err := dataplane.SetSysctlAt(dp.sysctlDir, "net.ipv4.ip_forward", "1"); err != nil {
				if errors.Is(err, syscall.EROFS) {
					return fmt.Errorf("%w (a container that is not privileged has /proc/sys read-only: mount the host's /proc/sys/net and pass --sysctl-dir, see docs/least-privilege.md)", err)
				}
				return err
			}
			if dp.localhostNodePorts {
				if err := setRouteLocalnet(dp.sysctlDir); err != nil {
					return err
				}
			}
			dp.conntrack.apply(dp.sysctlDir)
			// On SIGTERM the kernel tool in flight (a restore of 10,000
			// Services takes seconds) is killed at once: it commits nothing.
			context.AfterFunc(ctx, execx.Shutdown)
			metrics := controller.NewMetrics()
			health := controller.NewHealth(max(2*syncPeriod, time.Minute), nil)
			agent := &controller.Agent{Builder: controller.NewBuilder(), Dataplane: d, FullSyncPeriod: fullSyncPeriod, Metrics: metrics, Health: health}
			// Stale UDP flows are cleared in every dataplane mode; without
			// netfilter netlink the agent still runs, with a warning.
			if ct, err := conntrack.New(); err != nil {
				log.WithError(err).Warn("conntrack unavailable: stale UDP flows will not be cleared")
			} else {
				defer ct.Close()
				agent.Conntrack = ct
			}
			if err := serve(ctx, "metrics", metricsAddr, "/metrics", metrics.Handler()); err != nil {
				return err
			}
			if err := serve(ctx, "healthz", healthzAddr, "/", health.Handler()); err != nil {
				return err
			}
			if dp.countConnections {
				// A dataplane of its own for the scrapes: they read while
				// the agent's writes.
				reader, err := dp.open(nil)
				if err != nil {
					return err
				}
				metrics.WatchEndpoints(reader.Counts)
			}
			localhost := localhostCounter(dp.mode, dp.localhostNodePorts)
			metrics.WatchLocalhostNodePorts(localhost)
			if err := serveKubeProxyCompat(ctx, kubeProxyAddr, dp.mode, localhost); err != nil {
				return err
			}
			if err := serve(ctx, "kube-proxy-healthz", kubeProxyHealthzAddr, "/", controller.KubeProxyHealthHandler(health)); err != nil {
				return err
			}
			mode, err := lookupMode(dp.mode)
			if err != nil {
				return err
			}
			leftovers := newLeftoverCleaner(&dp, mode, modes)
			r := runner.New(leftovers.afterSync(agent.Sync), minSyncPeriod, syncPeriod, 0, nil)
			r.SetBurst(syncBurst)
			agent.Requeue = r.Trigger // a dataplane's RequeueAfter (IPVS draining)
			node.sysctlDir = dp.sysctlDir
			if err := node.setupParity(ctx, agent, d, addrs, kubeconfig, manifests, nodeName, r.Trigger); err != nil {
				return err
			}

			fields := logrus.Fields{"mode": dp.mode, "version": version, "node": nodeName}
			if manifests != "" {
				src := controller.NewManifestSource(manifests)
				agent.Source = src
				// The watch is in place before the first Load, so no
				// change can slip between the two.
				if err := src.StartWatch(ctx, r.Trigger); err != nil {
					return err
				}
				fields["manifests"] = manifests
			} else {
				src, events, err := startClusterSource(ctx, kubeconfig, proxyName, nodeName, r.Trigger)
				if err != nil {
					return err
				}
				agent.Events = events
				agent.Source, agent.Tracker = src, src.Tracker
				metrics.WatchTracker(src.Tracker)
				metrics.WatchAPIServer(src.API)
				gw.http = ing.enabled // HTTPRoutes through the nginx layer
				gw.nodeAddrs = addrs.get
				waitGateway, err := gw.start(ctx, kubeconfig, nodeName, agent, func() { r.Trigger(); ing.poke() })
				if err != nil {
					return err
				}
				defer waitGateway() // the status Lease released before we exit
				fields["kubeconfig"], fields["service-proxy-name"] = kubeconfig, proxyName
			}
			ing.httpRoutes = gw.httpRoutes()
			log.WithFields(fields).Info("steelyard starting")
			synced := make(chan struct{})
			go func() { r.Run(ctx.Done()); close(synced) }()
			if ing.enabled {
				// nginx proxies to VIPs: started before the first sync, it
				// dials a VIP that has no DNAT yet, and that SYN leaves an
				// un-NATed conntrack entry (SYN_SENT, 120 s) that black-holes
				// every later connect from the same source port (measured:
				// 504s in test/ingress TestWeights on a loaded machine).
				waitFirstSync(ctx, health, firstSyncWait)
			}
			waitIngress, err := ing.start(ctx, kubeconfig, manifests, nodeName, metrics.Registry)
			if err != nil {
				return err
			}
			<-ctx.Done()
			select {
			case <-synced:
			case <-time.After(shutdownGrace):
				// Go work of a big sync (building, rendering) cannot be
				// interrupted; nothing of it reaches the kernel any more.
				log.Warn("sync still running at shutdown; exiting without waiting for it")
			}
			waitIngress() // nginx stopped before we exit
			if n := execx.KillChildren(); n > 0 {
				log.WithField("children", n).Warn("killed child processes left at shutdown")
			}
			// Rules stay in place: connections keep flowing while we are
			// away, and the next start syncs without flushing.
			log.Info("stopping; rules left in place")
			if err := context.Cause(ctx); errors.Is(err, errPodCIDRsChanged) {
				return err
			}
			return nil
		},
	}
	dp.register(cmd, true)
	node.register(cmd, true)
	ing.register(cmd)
	gw.register(cmd, true)
	cmd.Flags().StringVar(&detectLocal, "detect-local-mode", DetectClusterCIDR, "how pod traffic is told from other sources (others are masqueraded to VIPs), as kube-proxy's flag: ClusterCIDR (--cluster-cidr; without it, clusterCIDR of the kube-system/kube-proxy ConfigMap when readable), NodeCIDR (this node's spec.podCIDRs; exits to restart when they change), or empty: ClusterCIDR when a cluster CIDR is known, else NodeCIDR")
	cmd.Flags().StringVar(&manifests, "manifests", "", "directory of Service and EndpointSlice manifests (YAML or JSON); without it, the API server is the source")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server (in-cluster config when empty)")
	cmd.Flags().StringVar(&nodeName, "node-name", defaultNodeName(), "this node's name (default: $NODE_NAME, else the hostname)")
	cmd.Flags().StringVar(&proxyName, "service-proxy-name", "", "handle only Services labelled service.kubernetes.io/service-proxy-name=<this> (run beside kube-proxy); empty: every Service without that label")
	cmd.Flags().StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:10279", "address of /metrics (kube-proxy's is :10249); empty: off")
	cmd.Flags().StringVar(&kubeProxyAddr, "kube-proxy-metrics-bind-address", "", "address of a kube-proxy compatible endpoint for tools written against kube-proxy (kube-proxy's metrics address is 127.0.0.1:10249): /proxyMode and kubeproxy_iptables_localhost_nodeports_accepted_packets_total on /metrics; empty: off")
	cmd.Flags().StringVar(&kubeProxyHealthzAddr, "kube-proxy-healthz-bind-address", "", "address of a kube-proxy compatible /healthz and /livez (kube-proxy's is 0.0.0.0:10256), for load balancers and tools that probe nodes at kube-proxy's port; empty: off")
	cmd.Flags().StringVar(&healthzAddr, "healthz-bind-address", "0.0.0.0:10276", "address of /healthz and /readyz (kube-proxy's is :10256); empty: off")
	cmd.Flags().DurationVar(&syncPeriod, "sync-period", 30*time.Second, "periodic sync interval: writes what changed and checks a canary rule (a flushed table forces a full resync)")
	cmd.Flags().DurationVar(&fullSyncPeriod, "full-sync-period", time.Hour, "full resync interval: reads the kernel back and rewrites what differs, repairing rules changed by hand")
	cmd.Flags().DurationVar(&minSyncPeriod, "min-sync-period", 250*time.Millisecond, "minimum time between syncs on average (--sync-burst may run back to back); bursts of changes merge")
	cmd.Flags().IntVar(&syncBurst, "sync-burst", defaultSyncBurst, "syncs that may start back to back before --min-sync-period holds them apart (kube-proxy's is 2); a sustained stream of changes still gets one sync per --min-sync-period")
	return cmd
}

// defaultSyncBurst is how many syncs may start back to back before
// --min-sync-period holds them apart. kube-proxy's burstSyncs is 2; with
// 2, changes about half a second apart (bench-k8s's stream) queued p99 164
// ms at 10,000 Services (run 20261207T064726Z): a third change within a
// quarter second waited for a token. Replayed through the runner's bucket
// (controller/runner TestBurstModel) that stream waits p99 152 ms at burst
// 2 and 20 ms (the sync in front) from 4 on: docs/benchmarks.md "The
// runner's burst". A sustained storm is still held to one sync per period;
// the burst only lets a short run of changes through at once.
const defaultSyncBurst = 8

// firstSyncWait bounds how long the nginx layer waits for the first
// successful sync: a dataplane that keeps failing must not keep L7 down.
const firstSyncWait = 30 * time.Second

// waitFirstSync returns once the first sync has succeeded, after limit, or
// when ctx ends (limit bounds the wait).
func waitFirstSync(ctx context.Context, h *controller.Health, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-h.ReadyC():
	case <-t.C:
		log.WithField("waited", limit).Warn("no successful sync yet: starting nginx anyway")
	case <-ctx.Done():
	}
}

// shutdownGrace is how long SIGTERM waits for the sync in progress to end
// once its kernel children are killed; the agent exits within 2 s of
// SIGTERM (test/e2e/sigterm_test.go).
const shutdownGrace = time.Second

func defaultNodeName() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

// startClusterSource connects to the API server and starts the watches;
// it returns once their caches are filled.
func startClusterSource(ctx context.Context, kubeconfig, proxyName, nodeName string, changed func()) (*controller.ClusterSource, record.EventRecorder, error) {
	// client-go logs through klog; send it to logrus like everything else.
	klog.SetLogger(logrusr.New(logrus.WithField("subsys", "client-go")))
	client, err := newClient(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	src, err := controller.NewClusterSource(client, controller.ClusterOptions{ServiceProxyName: proxyName})
	if err != nil {
		return nil, nil, err
	}
	if err := src.Start(ctx, changed); err != nil {
		return nil, nil, fmt.Errorf("watching the API server: %w", err)
	}
	// Events go through client-go's broadcaster, whose correlator merges
	// repeats and rate-limits each object.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "steelyard", Host: nodeName})
	return src, recorder, nil
}

// serve runs an HTTP server on addr until ctx is done; the listener is open
// when serve returns, so a bad address fails at start.
func serve(ctx context.Context, name, addr, pattern string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s server: %w", name, err)
	}
	mux := http.NewServeMux()
	mux.Handle(pattern, h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.WithError(err).WithField("server", name).Error("HTTP server stopped")
		}
	}()
	log.WithFields(logrus.Fields{"server": name, "address": ln.Addr().String()}).Info("serving")
	return nil
}

// restConfig is the API server config of kubeconfig, or in-cluster.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("API server config: %w", err)
	}
	cfg.UserAgent = "steelyard/" + version
	return cfg, nil
}

// protobuf is the content type the core clientset asks for. kube-proxy
// does the same: the lists and watches of Services and EndpointSlices
// decode with far less garbage than JSON (the first list at 10,000
// Services is the agent's peak of memory).
const protobuf = "application/vnd.kubernetes.protobuf"

// kubeClient is the core clientset of cfg, speaking protobuf (JSON only
// where the server offers nothing else).
func kubeClient(cfg *rest.Config) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.ContentType = protobuf
	c.AcceptContentTypes = protobuf + ",application/json"
	return kubernetes.NewForConfig(c)
}

// newClient connects to the API server of kubeconfig, or in-cluster.
func newClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubeClient(cfg)
}
