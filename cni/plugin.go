package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Host is the kernel work the plugin does, in the host network namespace
// (where the runtime runs the plugin) unless the method says otherwise.
type Host interface {
	// BridgePort reports whether the host interface ifName is a port of a
	// Linux bridge; ok is false (and err nil) when ifName does not exist.
	BridgePort(ifName string) (port, ok bool, err error)
	// Hairpin reads the hairpin flag of a bridge port; SetHairpin sets it.
	Hairpin(ifName string) (bool, error)
	SetHairpin(ifName string, on bool) error
	// Forwarding reads net.ipv4.ip_forward; EnableForwarding sets it to 1.
	Forwarding() (bool, error)
	EnableForwarding() error
	// PodAddrs returns the addresses of ifName inside the network
	// namespace at netnsPath; none (and no error) when the namespace or
	// the interface is gone.
	PodAddrs(netnsPath, ifName string) ([]netip.Addr, error)
	// DeleteFlows deletes the conntrack entries whose original destination
	// or reply source is one of addrs, and returns how many it deleted.
	DeleteFlows(addrs []netip.Addr) (int, error)
}

// Plugin runs the CNI commands. Stdout receives the result and nothing
// else; Stderr gets the informational lines.
type Plugin struct {
	Host   Host
	Stdout io.Writer
	Stderr io.Writer
}

// Funcs returns the commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

func (p *Plugin) logf(format string, args ...any) {
	if p.Stderr != nil {
		fmt.Fprintf(p.Stderr, "steelyard-cni: "+format+"\n", args...)
	}
}

// Add configures the host side of a new pod and passes the prevResult on.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev := conf.PrevResult()
	if prev == nil {
		return errorf(types.ErrInvalidNetworkConfig, nil, "no prevResult: steelyard-cni must be chained after the main CNI plugin in a conflist, not used alone")
	}
	if err := p.Host.EnableForwarding(); err != nil {
		return errorf(types.ErrInternal, err, "cannot enable net.ipv4.ip_forward")
	}
	if conf.HairpinOn() {
		ports, err := p.bridgePorts(prev)
		if err != nil {
			return err
		}
		for _, port := range ports {
			if err := p.Host.SetHairpin(port, true); err != nil {
				return errorf(types.ErrInternal, err, "cannot turn on hairpin mode on bridge port %s", port)
			}
		}
	}
	// The prevResult passes through unchanged, in the caller's version.
	return printResult(p.Stdout, conf.PluginConf.PrevResult, conf.CNIVersion)
}

// bridgePorts returns the host-side interfaces of prev that are bridge
// ports (the bridge plugin's host veth; not the bridge itself).
func (p *Plugin) bridgePorts(prev *current.Result) ([]string, error) {
	var out []string
	for _, iface := range prev.Interfaces {
		if iface == nil || iface.Sandbox != "" || iface.Name == "" {
			continue
		}
		port, ok, err := p.Host.BridgePort(iface.Name)
		if err != nil {
			return nil, errorf(types.ErrInternal, err, "cannot read host interface %s", iface.Name)
		}
		if ok && port {
			out = append(out, iface.Name)
		}
	}
	return out, nil
}

// Check verifies what Add set: forwarding on, hairpin on every bridge port
// of the prevResult.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev := conf.PrevResult()
	if prev == nil {
		return errorf(types.ErrInvalidNetworkConfig, nil, "CHECK needs a prevResult: steelyard-cni must be chained after the main CNI plugin")
	}
	on, err := p.Host.Forwarding()
	if err != nil {
		return errorf(types.ErrInternal, err, "cannot read net.ipv4.ip_forward")
	}
	if !on {
		return errorf(types.ErrInternal, nil, "net.ipv4.ip_forward is off")
	}
	if conf.HairpinOn() {
		ports, err := p.bridgePorts(prev)
		if err != nil {
			return err
		}
		for _, port := range ports {
			hp, err := p.Host.Hairpin(port)
			if err != nil {
				return errorf(types.ErrInternal, err, "cannot read hairpin mode of bridge port %s", port)
			}
			if !hp {
				return errorf(types.ErrInternal, nil, "hairpin mode is off on bridge port %s", port)
			}
		}
	}
	return nil
}

// Del deletes the conntrack entries pointing at the pod's addresses. It
// succeeds when there is nothing left to do (a second DEL, no prevResult
// and no namespace).
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		// A prevResult we cannot read must not block the pod's teardown:
		// retry without it.
		var terr *types.Error
		if errors.As(err, &terr) && terr.Code == types.ErrDecodingFailure {
			conf, err = parseWithoutPrevResult(args.StdinData)
		}
		if err != nil {
			return err
		}
	}
	if !conf.ConntrackCleanupOn() {
		return nil
	}
	addrs := map[netip.Addr]bool{}
	if prev := conf.PrevResult(); prev != nil {
		for _, ip := range prev.IPs {
			if ip == nil {
				continue
			}
			if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
				addrs[a.Unmap()] = true
			}
		}
	}
	if len(addrs) == 0 && args.Netns != "" && args.IfName != "" {
		// No (usable) prevResult: read the pod's interface, which is
		// still there when this plugin's DEL runs first (DEL runs the
		// chain in reverse).
		found, err := p.Host.PodAddrs(args.Netns, args.IfName)
		if err != nil {
			p.logf("cannot read the addresses of %s in %s: %v", args.IfName, args.Netns, err)
		}
		for _, a := range found {
			addrs[a.Unmap()] = true
		}
	}
	if len(addrs) == 0 {
		return nil
	}
	list := make([]netip.Addr, 0, len(addrs))
	for a := range addrs {
		list = append(list, a)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Less(list[j]) })
	n, err := p.Host.DeleteFlows(list)
	if err != nil {
		return errorf(types.ErrInternal, err, "cannot delete the conntrack entries of %v", list)
	}
	p.logf("deleted %d conntrack entries pointing at %v", n, list)
	return nil
}

// parseWithoutPrevResult parses stdin ignoring its prevResult.
func parseWithoutPrevResult(stdin []byte) (*Config, error) {
	var raw map[string]any
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "steelyard-cni: cannot parse the network configuration", err.Error())
	}
	delete(raw, "prevResult")
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "steelyard-cni: cannot parse the network configuration", err.Error())
	}
	return ParseConfig(b)
}

// Status reports the plugin ready: it has no daemon to wait for.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	_, err := ParseConfig(args.StdinData)
	return err
}

// GC has nothing to collect: the plugin keeps no per-attachment state.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	_, err := ParseConfig(args.StdinData)
	return err
}

// printResult writes res in version to w.
func printResult(w io.Writer, res types.Result, version string) error {
	converted, err := res.GetAsVersion(version)
	if err != nil {
		return errorf(types.ErrIncompatibleCNIVersion, err, "cannot convert prevResult to %s", version)
	}
	b, err := json.MarshalIndent(converted, "", "    ")
	if err != nil {
		return errorf(types.ErrInternal, err, "cannot encode the result")
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
