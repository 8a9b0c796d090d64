package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/steelyard-net/steelyard/cni"
)

// newInstallCNICommand is the DaemonSet init container's job: put
// steelyard-cni on the node and chain it after the main CNI plugin.
func newInstallCNICommand() *cobra.Command {
	var o cni.InstallOptions
	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "Copy steelyard-cni into the node's CNI bin folder and chain it last in the node's conflist",
		Long: `install-cni copies the steelyard-cni plugin into the node's CNI bin folder and
appends it as the last plugin of the conflist the container runtime uses (the
first *.conflist, *.conf or *.json of the folder in lexical order, or
--conflist). Each file is replaced atomically (temporary file, then rename).
Running it again changes nothing; a conflist that already has steelyard-cni is
left alone; a malformed conflist is reported and left untouched.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logf = func(format string, args ...any) { log.Infof(format, args...) }
			return cni.Install(o)
		},
	}
	cmd.Flags().StringVar(&o.Plugin, "plugin", defaultPluginPath(), "the steelyard-cni binary to install")
	cmd.Flags().StringVar(&o.BinDir, "cni-bin-dir", "/opt/cni/bin", "the node's CNI bin folder")
	cmd.Flags().StringVar(&o.ConfDir, "cni-conf-dir", "/etc/cni/net.d", "the node's CNI configuration folder")
	cmd.Flags().StringVar(&o.Conflist, "conflist", "", "conflist to edit, in --cni-conf-dir (default: the one the runtime uses)")
	cmd.Flags().DurationVar(&o.Wait, "wait", 0, "how long to wait for the main CNI plugin's conflist to appear")
	return cmd
}

// defaultPluginPath is steelyard-cni beside this binary (as in the image).
func defaultPluginPath() string {
	exe, err := os.Executable()
	if err != nil {
		return cni.PluginType
	}
	return filepath.Join(filepath.Dir(exe), cni.PluginType)
}
