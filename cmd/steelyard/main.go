// Command steelyard is the node agent (run) and the operator CLI (explain,
// verify, cleanup, version) in one binary.
package main

import (
	"fmt"
	"os"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if err := newRootCommand().Execute(); err != nil {
		if code, ok := err.(exitCode); ok {
			os.Exit(int(code))
		}
		fmt.Fprintln(os.Stderr, "steelyard:", err)
		os.Exit(2)
	}
}

// exitCode ends the program with that status and no further message (the
// command already printed what it had to say).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func newRootCommand() *cobra.Command {
	var logLevel, logFormat string
	root := &cobra.Command{
		Use:           "steelyard",
		Short:         "Weighted L4 forwarding for Kubernetes Service VIPs",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			return setupLogging(logLevel, logFormat)
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	root.AddCommand(newRunCommand(), newExplainCommand(), newVerifyCommand(), newCleanupCommand(), newVersionCommand())
	root.AddCommand(newInstallCNICommand())
	return root
}

func setupLogging(level, format string) error {
	lvl, err := logrus.ParseLevel(level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logrus.SetLevel(lvl)
	logrus.SetOutput(os.Stderr)
	switch format {
	case "text":
		logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		logrus.SetFormatter(&logrus.JSONFormatter{})
	default:
		return fmt.Errorf("--log-format %q: want text or json", format)
	}
	return nil
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "steelyard", version)
		},
	}
}
