package main

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
)

func newExplainCommand() *cobra.Command {
	var (
		dp       dataplaneFlags
		output   string
		observed bool
		since    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "explain",
		Short: "Show, from the live kernel, which backends each VIP reaches and with what share",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since < 0 || (since > 0 && !observed) {
				return fmt.Errorf("--since %s: want a positive duration, with --observed", since)
			}
			d, err := dp.open(nil)
			if err != nil {
				return err
			}
			if observed {
				return explainObserved(cmd, d, since, output)
			}
			views, err := d.Explain()
			if err != nil {
				return err
			}
			return dataplane.WriteViews(cmd.OutOrStdout(), views, output)
		},
	}
	dp.register(cmd, false)
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	cmd.Flags().BoolVar(&observed, "observed", false, "print each clusterIP's configured shares beside the new connections the kernel counted per endpoint (the agent runs with --count-connections; IPVS always counts), with a binomial check")
	cmd.Flags().DurationVar(&since, "since", 0, "with --observed: count only the connections of the next DURATION (two reads of the counters), instead of all since each counter began")
	return cmd
}

func newVerifyCommand() *cobra.Command {
	var (
		dp         dataplaneFlags
		manifests  string
		kubeconfig string
		proxyName  string
		nodeName   string
		node       nodeFlags
		gw         gatewayFlags
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Compare the live kernel with the desired state; exit 1 with a diff when they differ",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				svcs   []*corev1.Service
				slices []*discoveryv1.EndpointSlice
				source = manifests
			)
			if manifests != "" {
				var errs []error
				svcs, slices, errs = controller.NewManifestSource(manifests).Load()
				for _, e := range errs {
					fmt.Fprintln(cmd.ErrOrStderr(), "warning:", e)
				}
			} else {
				client, err := newClient(kubeconfig)
				if err != nil {
					return err
				}
				svcs, slices, err = controller.ListCluster(cmd.Context(), client, controller.ClusterOptions{ServiceProxyName: proxyName})
				if err != nil {
					return err
				}
				source = "the API server"
			}
			d, err := dp.open(nil)
			if err != nil {
				return err
			}
			builder, primary := node.builder(cmd.Context(), d, kubeconfig, manifests, nodeName)
			// Where HTTP listeners are forwarded: as run finds them without
			// --nodeport-addresses.
			gw.nodeAddrs = func() []netip.Addr { return nodePortAddresses(nil, primary) }
			if err := gw.check(manifests); err != nil {
				return err
			}
			if err := gw.routes(cmd.Context(), kubeconfig, svcs, builder); err != nil {
				return err
			}
			state, problems := builder.Build(svcs, slices)
			for _, p := range problems {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", p.Error())
			}
			live, err := d.Explain()
			if err != nil {
				return err
			}
			diff := dataplane.Diff(dataplane.Expected(state), live)
			out := cmd.OutOrStdout()
			if len(diff) == 0 {
				fmt.Fprintf(out, "OK: %d VIPs agree with %s\n", len(state.Services), source)
				return nil
			}
			fmt.Fprintf(out, "MISMATCH: the kernel differs from %s (- desired, + live):\n", source)
			for _, l := range diff {
				fmt.Fprintln(out, l)
			}
			return exitCode(1)
		},
	}
	dp.register(cmd, false)
	cmd.Flags().StringVar(&manifests, "manifests", "", "directory of Service and EndpointSlice manifests; without it, the API server")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server (in-cluster config when empty)")
	cmd.Flags().StringVar(&proxyName, "service-proxy-name", "", "as for run: which Services the agent handles")
	cmd.Flags().StringVar(&nodeName, "node-name", defaultNodeName(), "as for run: this node's name (local endpoints)")
	node.register(cmd, false)
	gw.register(cmd, false)
	return cmd
}

func newCleanupCommand() *cobra.Command {
	var dp dataplaneFlags
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove everything steelyard created in the kernel, and nothing else",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := lookupMode(dp.mode)
			if err != nil {
				return err
			}
			return m.cleanup(&dp)
		},
	}
	dp.register(cmd, false)
	return cmd
}

// explainObserved prints configured against observed shares: all counted
// connections, or with since those counted between two reads that far
// apart.
func explainObserved(cmd *cobra.Command, d dataplane.Dataplane, since time.Duration, output string) error {
	counts, err := d.Counts()
	if err != nil {
		return err
	}
	if since > 0 {
		select {
		case <-time.After(since):
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		}
		now, err := d.Counts()
		if err != nil {
			return err
		}
		counts = dataplane.SubtractCounts(now, counts)
	}
	views, err := d.Explain()
	if err != nil {
		return err
	}
	if len(counts) == 0 && output != "json" {
		fmt.Fprintln(cmd.ErrOrStderr(), "no counters in the kernel: is the agent run with --count-connections?")
	}
	return dataplane.WriteObserved(cmd.OutOrStdout(), dataplane.Observe(views, counts), output)
}
