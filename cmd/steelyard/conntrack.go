package main

import (
	"strconv"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/steelyard-net/steelyard/dataplane"
)

// conntrackTimeouts are run's --conntrack-tcp-timeout-* flags: the node's
// TCP conntrack timeouts, as kube-proxy sets them (its defaults, 24h and
// 1h). They are per network namespace, so the node's alone. Zero leaves a
// timeout as it is.
type conntrackTimeouts struct {
	established, closeWait time.Duration
}

// conntrackSysctls names each timeout's sysctl.
func (c conntrackTimeouts) sysctls() map[string]time.Duration {
	return map[string]time.Duration{
		"net.netfilter.nf_conntrack_tcp_timeout_established": c.established,
		"net.netfilter.nf_conntrack_tcp_timeout_close_wait":  c.closeWait,
	}
}

// apply writes the timeouts under dir (--sysctl-dir). A timeout that
// cannot be written is a warning, not an error: the agent's Services work
// without it (a read-only /proc/sys, a kernel without conntrack's
// sysctls), only idle connections expire on the kernel's own schedule.
func (c conntrackTimeouts) apply(dir string) {
	for name, d := range c.sysctls() {
		if d <= 0 {
			continue
		}
		secs := strconv.Itoa(int(d / time.Second))
		if err := dataplane.SetSysctlAt(dir, name, secs); err != nil {
			log.WithError(err).WithFields(logrus.Fields{"sysctl": name, "value": secs}).Warn("conntrack timeout left as it is")
			continue
		}
		log.WithFields(logrus.Fields{"sysctl": name, "value": secs}).Debug("conntrack timeout set")
	}
}
