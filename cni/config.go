// Package cni is the logic of steelyard-cni, a chained CNI plugin that runs
// after the cluster's main plugin for every pod, so the pod works with
// steelyard's VIPs from its first packet to its deletion:
//
//   - ADD (needs a prevResult: it only ever runs chained) turns on hairpin
//     mode on the pod's host-side bridge port, so a pod can reach itself
//     through a VIP, makes sure net.ipv4.ip_forward is on, and prints the
//     prevResult unchanged.
//   - DEL deletes the conntrack entries that still point at the pod's IPs
//     (original destination or reply source), so UDP flows NATed to a
//     deleted pod move to another endpoint at once instead of talking to a
//     dead address for minutes. It is idempotent and works without a
//     prevResult (the IPs are then read from the pod's interface, if it
//     still exists).
//   - CHECK verifies what ADD set.
//
// Routed main plugins (ptp, Calico) have no bridge port: hairpin mode is
// then not needed and ADD leaves it alone. Kernel work goes through the
// Host interface, so the plugin logic is unit-tested with a fake.
package cni

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// PluginType is the plugin's binary name and its "type" in a conflist.
const PluginType = "steelyard-cni"

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = []string{"0.4.0", "1.0.0", "1.1.0"}

// Config is the plugin's entry in a conflist:
//
//	{"type": "steelyard-cni", "hairpin": true, "conntrackCleanup": true}
type Config struct {
	types.PluginConf
	// Hairpin turns on hairpin mode on the pod's host-side bridge port
	// (default on).
	Hairpin *bool `json:"hairpin,omitempty"`
	// ConntrackCleanup deletes the conntrack entries pointing at the pod's
	// IPs on DEL (default on).
	ConntrackCleanup *bool `json:"conntrackCleanup,omitempty"`

	// prevResult is the parsed prevResult in the current result version,
	// nil when there was none.
	prevResult *current.Result
}

// HairpinOn reports whether the hairpin option is on.
func (c *Config) HairpinOn() bool { return c.Hairpin == nil || *c.Hairpin }

// ConntrackCleanupOn reports whether the conntrackCleanup option is on.
func (c *Config) ConntrackCleanupOn() bool { return c.ConntrackCleanup == nil || *c.ConntrackCleanup }

// PrevResult returns the prevResult converted to the current result type,
// or nil.
func (c *Config) PrevResult() *current.Result { return c.prevResult }

// ParseConfig parses the plugin's stdin. A prevResult of any supported spec
// version is parsed and converted to the current result type. Errors are
// CNI errors (code and message).
func ParseConfig(stdin []byte) (*Config, error) {
	conf := &Config{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "steelyard-cni: cannot parse the network configuration", err.Error())
	}
	if conf.CNIVersion == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "steelyard-cni: the network configuration has no cniVersion", "")
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "steelyard-cni: cannot parse prevResult", err.Error())
	}
	if conf.PluginConf.PrevResult != nil {
		res, err := current.NewResultFromResult(conf.PluginConf.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "steelyard-cni: cannot convert prevResult", err.Error())
		}
		conf.prevResult = res
	}
	return conf, nil
}

// errorf returns a CNI error with code and a formatted message.
func errorf(code uint, details error, format string, args ...any) *types.Error {
	d := ""
	if details != nil {
		d = details.Error()
	}
	return types.NewError(code, fmt.Sprintf("steelyard-cni: "+format, args...), d)
}
