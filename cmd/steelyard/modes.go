package main

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/steelyard-net/steelyard/controller"
	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/iptables"
	"github.com/steelyard-net/steelyard/dataplane/ipvs"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// dataplaneMode is one --mode: how run, explain and verify open it and how
// cleanup removes what it created. Every mode opens one dual-stack
// dataplane (IPv6 where the node has it); nothing else in the command
// knows the modes apart.
type dataplaneMode struct {
	name string
	// open returns the mode's dataplane over the kernel of this network
	// namespace. It writes nothing.
	open func(f *dataplaneFlags, env modeEnv) (*dataplane.DualStack, error)
	// cleanup removes everything the mode created, in every flavour.
	cleanup func(f *dataplaneFlags) error
	// rules is the kernel API the mode's rules live in (rulesIPTables,
	// rulesNFTables): a running mode removes the other API's leftovers.
	rules string
	// present, when set, tells cheaply whether the mode left anything on
	// this node; nil: cleanup finds out itself.
	present func(f *dataplaneFlags) bool
	// ownLeftovers, when set, removes what the mode keeps outside its
	// rules API; a running mode of the same API calls it (the nftables
	// mode detaches the ebpf mode's programs, and keeps the tables).
	ownLeftovers func(f *dataplaneFlags) error
}

// modeEnv is what every mode's dataplane is constructed with besides the
// flags.
type modeEnv struct {
	masquerade dataplane.Masquerade
	// nodeAddresses returns the addresses node ports are open on; it is
	// called at each Sync (the agent learns them after opening).
	nodeAddresses func() []netip.Addr
}

// modes is the one table of dataplane modes.
var modes = []dataplaneMode{
	{name: "iptables", open: openIPTablesMode, cleanup: cleanupIPTablesMode, rules: rulesIPTables, present: iptablesPresent},
	{name: "ipvs", open: openIPVSMode, cleanup: cleanupIPVSMode, rules: rulesIPTables, present: ipvsPresent},
	{name: "nftables", open: openNFTablesMode, cleanup: cleanupNFTablesMode, rules: rulesNFTables, present: nftablesPresent},
	{name: "ebpf", open: openEBPFMode, cleanup: cleanupEBPFMode, rules: rulesNFTables, present: ebpfPresent, ownLeftovers: unloadEBPF},
}

func modeNames() string {
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = m.name
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// lookupMode returns the mode named name.
func lookupMode(name string) (dataplaneMode, error) {
	for _, m := range modes {
		if m.name == name {
			return m, nil
		}
	}
	return dataplaneMode{}, fmt.Errorf("--mode %q: want %s", name, modeNames())
}

// open returns the dataplane the flags select, with node addresses from
// addrs (nil: none).
func (f *dataplaneFlags) open(addrs *nodeAddressSource) (*dataplane.DualStack, error) {
	m, err := lookupMode(f.mode)
	if err != nil {
		return nil, err
	}
	masq, err := dataplane.ParseMasquerade(f.clusterCIDRs, f.masqueradeAll, f.masqueradeBit)
	if err != nil {
		return nil, err
	}
	env := modeEnv{masquerade: masq}
	if addrs != nil {
		env.nodeAddresses = addrs.get
	}
	return m.open(f, env)
}

// nodeAddressSource is the node port addresses, known only once the agent
// has read its Node (after it opened the dataplane): nil until set.
type nodeAddressSource struct {
	mu sync.Mutex
	fn func() []netip.Addr
}

func (s *nodeAddressSource) set(fn func() []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fn = fn
}

func (s *nodeAddressSource) get() []netip.Addr {
	s.mu.Lock()
	fn := s.fn
	s.mu.Unlock()
	if fn == nil {
		return nil
	}
	return fn()
}

// ip6tablesWorks returns ip6tables of the flavour, or nil (with a log
// line) where it does not work on this node (a kernel without IPv6).
func ip6tablesWorks(mode iptables.Mode, what string) iptables.Interface {
	ipt6, err := iptables.New6(mode)
	if err == nil {
		_, err = ipt6.SaveAll()
	}
	if err != nil {
		log.WithError(err).Info("ip6tables unusable: " + what + " programs IPv4 only")
		return nil
	}
	return ipt6
}

func openIPTablesMode(f *dataplaneFlags, env modeEnv) (*dataplane.DualStack, error) {
	ipt, mode, err := iptables.New(iptables.Mode(f.iptablesMode))
	if err != nil {
		return nil, err
	}
	log.WithField("iptables", mode).Debug("using iptables")
	// nfacct counts localhost node ports; endpoints are counted by their
	// DNAT rules, which Counts reads whatever the flags.
	cfg := iptables.Config{Masquerade: env.masquerade, NodeAddresses: env.nodeAddresses, LocalhostNodePorts: f.localhostNodePorts,
		NFAcct: nfacct.Kernel{}, CountConnections: f.countConnections}
	ipt6 := ip6tablesWorks(mode, "iptables mode")
	if ipt6 == nil {
		return iptables.NewDualStack(ipt, nil, cfg), nil
	}
	return iptables.NewDualStack(ipt, ipt6, cfg), nil
}

// cleanupIPTablesMode cleans both flavours under --iptables-mode auto:
// rules left in the other one would still steer traffic.
func cleanupIPTablesMode(f *dataplaneFlags) error {
	flavours := []iptables.Mode{iptables.Mode(f.iptablesMode)}
	if f.iptablesMode == string(iptables.ModeAuto) {
		flavours = nil
		for _, m := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
			if _, err := exec.LookPath("iptables-" + string(m)); err == nil {
				flavours = append(flavours, m)
			}
		}
		if len(flavours) == 0 {
			flavours = []iptables.Mode{iptables.ModeAuto}
		}
	}
	for _, m := range flavours {
		ipt, _, err := iptables.New(m)
		if err != nil {
			return err
		}
		var ipt6 iptables.Interface
		if i6, err := iptables.New6(m); err == nil {
			if _, err := i6.SaveAll(); err == nil {
				ipt6 = i6 // else no IPv6 tables: nothing of ours there
			}
		}
		if err := iptables.NewDualStack(ipt, ipt6, iptables.Config{NFAcct: nfacct.Kernel{}}).Cleanup(); err != nil {
			return fmt.Errorf("cleanup (%s): %w", m, err)
		}
	}
	// The localhost node port counter, once no rule names it; a kernel
	// without nfacct has none to remove.
	if err := (nfacct.Kernel{}).Delete(iptables.LocalhostCounter); err != nil {
		log.WithError(err).Debug("nfacct counter not removed")
	}
	return nil
}

func openIPVSMode(f *dataplaneFlags, env modeEnv) (*dataplane.DualStack, error) {
	cfg := ipvs.Config{Scheduler: f.ipvsScheduler, GracefulPeriod: f.ipvsGracefulPeriod,
		Masquerade: env.masquerade, NodeAddresses: env.nodeAddresses, SysctlDir: f.sysctlDir}
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
	return ipvs.NewDualStackKernel(iptables.Mode(f.iptablesMode), cfg)
}

func cleanupIPVSMode(f *dataplaneFlags) error {
	d, err := ipvs.NewDualStackKernel(iptables.Mode(f.iptablesMode), ipvs.Config{})
	if err != nil {
		return err
	}
	return d.Cleanup()
}

func openNFTablesMode(f *dataplaneFlags, env modeEnv) (*dataplane.DualStack, error) {
	return nftables.NewDualStackKernel(nftables.Config{Masquerade: env.masquerade, NodeAddresses: env.nodeAddresses, LocalhostNodePorts: f.localhostNodePorts,
		CountConnections: f.countConnections})
}

func cleanupNFTablesMode(*dataplaneFlags) error {
	d, err := nftables.NewDualStackKernel(nftables.Config{})
	if err != nil {
		return err
	}
	return d.Cleanup()
}
