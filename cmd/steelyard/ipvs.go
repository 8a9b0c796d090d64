package main

import (
	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
)

// registerIPVS adds the IPVS mode's flags to run.
func (f *dataplaneFlags) registerIPVS(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ipvsScheduler, "ipvs-scheduler", ipvs.DefaultScheduler,
		"--mode ipvs: the node's scheduler (rr, wrr, lc, wlc, sh, mh); the annotation "+controller.AnnotationScheduler+" overrides it per Service")
	cmd.Flags().DurationVar(&f.ipvsGracefulPeriod, "ipvs-graceful-period", ipvs.DefaultGracefulPeriod,
		"--mode ipvs: how long a leaving endpoint drains at weight 0 at most; it is deleted earlier when its last connection ends")
}
