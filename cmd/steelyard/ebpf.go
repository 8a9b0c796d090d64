package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/ebpf"
	"github.com/steelyard-net/steelyard/dataplane/nftables"
)

// ebpfFlags are the flags of --mode ebpf (dataplane/ebpf).
type ebpfFlags struct {
	// cgroupPath is the cgroup v2 directory the socket programs attach
	// to; run needs it, the other commands read the pins only.
	cgroupPath string
	// pinDir is the bpffs directory of the maps and links.
	pinDir string
}

// registerEBPF adds the ebpf mode's flags to every command: explain,
// verify and cleanup find the maps through --bpf-pin-dir as run does.
func (f *dataplaneFlags) registerEBPF(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.ebpf.cgroupPath, "cgroup-path", "",
		"--mode ebpf: the cgroup v2 directory whose sockets are balanced (on a node the cgroup2 mount holding the pods and the host's processes: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid layout); required by run, never guessed")
	cmd.Flags().StringVar(&f.ebpf.pinDir, "bpf-pin-dir", ebpf.DefaultPinDir,
		"--mode ebpf: the bpffs directory where the maps and program links are pinned")
}

func openEBPFMode(f *dataplaneFlags, env modeEnv) (*dataplane.DualStack, error) {
	cfg := ebpf.Config{CgroupPath: f.ebpf.cgroupPath, PinDir: f.ebpf.pinDir, CountConnections: f.countConnections,
		NFTables: nftables.Config{Masquerade: env.masquerade, NodeAddresses: env.nodeAddresses, LocalhostNodePorts: f.localhostNodePorts,
			CountConnections: f.countConnections}}
	if cfg.CgroupPath == "" {
		// explain and verify read the pins and never attach.
		return ebpf.NewDualStackReader(cfg)
	}
	return ebpf.NewDualStackKernel(cfg)
}

func cleanupEBPFMode(f *dataplaneFlags) error {
	return ebpf.Cleanup(f.ebpf.pinDir, nftables.Config{})
}

// unloadEBPF detaches the ebpf mode's programs and unpins its maps, and
// leaves the nftables tables (another nftables-API mode runs on them).
func unloadEBPF(f *dataplaneFlags) error {
	return ebpf.Unload(f.ebpf.pinDir)
}

// ebpfPresent reports whether the ebpf mode left its pins or its nftables
// tables here.
func ebpfPresent(f *dataplaneFlags) bool {
	if _, err := os.Stat(f.ebpf.pinDir); err == nil {
		return true
	}
	return nftables.TablesPresent()
}
