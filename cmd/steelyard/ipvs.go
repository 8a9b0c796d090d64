package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
)

// registerIPVS adds the IPVS mode's flags to run.
func (f *dataplaneFlags) registerIPVS(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ipvsScheduler, "ipvs-scheduler", ipvs.DefaultScheduler,
		"--mode ipvs: the node's scheduler (rr, wrr, lc, wlc, sh, mh); the annotation "+controller.AnnotationScheduler+" overrides it per Service")
	cmd.Flags().DurationVar(&f.ipvsGracefulPeriod, "ipvs-graceful-period", ipvs.DefaultGracefulPeriod,
		"--mode ipvs: how long a leaving endpoint drains at weight 0 at most; it is deleted earlier when its last connection ends")
}

// openIPVS returns the IPVS dataplane of the current network namespace,
// both IP families where ip6tables works.
func (f *dataplaneFlags) openIPVS() (dataplane.Dataplane, error) {
	cfg := ipvs.Config{Scheduler: f.ipvsScheduler, GracefulPeriod: f.ipvsGracefulPeriod,
		MasqueradeAll: f.masqueradeAll, MasqueradeBit: f.masqueradeBit}
	if cfg.Scheduler != "" {
		s, err := controller.ParseScheduler(cfg.Scheduler)
		if err != nil {
			return nil, fmt.Errorf("--ipvs-scheduler: %w", err)
		}
		cfg.Scheduler = s
	}
	if cfg.GracefulPeriod < 0 {
		return nil, fmt.Errorf("--ipvs-graceful-period %s: want a positive duration", cfg.GracefulPeriod)
	}
	if cfg.GracefulPeriod == 0 {
		cfg.GracefulPeriod = time.Nanosecond // 0 means "delete at once", not the default
	}
	cidrs, err := f.masquerade()
	if err != nil {
		return nil, err
	}
	cfg.ClusterCIDRs = cidrs
	return ipvs.NewDualStackKernel(iptables.Mode(f.iptablesMode), cfg)
}

// cleanupIPVS removes the IPVS mode's kernel state, both families (cleanup
// --mode ipvs).
func cleanupIPVS(iptablesMode string) error {
	p, err := ipvs.NewDualStackKernel(iptables.Mode(iptablesMode), ipvs.Config{})
	if err != nil {
		return err
	}
	return p.Cleanup()
}

// ipvsIPv6 reports whether d is the IPVS dataplane with its IPv6 half, so
// that the Builder builds IPv6 Service ports for it.
func ipvsIPv6(d dataplane.Dataplane) bool {
	ds, ok := d.(*ipvs.DualStack)
	return ok && ds.V6 != nil
}
