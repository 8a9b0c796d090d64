// Command steelyard-cluster runs the cluster of test/node/cluster for a
// person (`make cluster-up [NODES=3]`, `make cluster-down`):
//
//	steelyard-cluster up [--state DIR] [--nodes N] [--dual-stack]
//	                                      start it (N nodes, default 1;
//	                                      --dual-stack: IPv4 and IPv6,
//	                                      2 nodes or more), print
//	                                      the kubeconfig path, keep running
//	                                      until SIGINT/SIGTERM, then tear
//	                                      everything down
//	steelyard-cluster down [--state DIR]  stop the one `up` started
//
// DIR (default /tmp/steelyard-cluster) holds the pid of `up`, its log and a
// file "kubeconfig" naming the admin's kubeconfig once the node is Ready.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/steelyard-net/steelyard/test/node/cluster"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: steelyard-cluster up|down [--state DIR]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	state := fs.String("state", "/tmp/steelyard-cluster", "state directory")
	nodes := fs.Int("nodes", 1, "number of nodes (up)")
	dual := fs.Bool("dual-stack", false, "IPv4 and IPv6 Service, pod and node addresses (up; 2 nodes or more)")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "up":
		err = up(*state, *nodes, *dual)
	case "down":
		err = down(*state)
	default:
		err = fmt.Errorf("unknown command %q (up or down)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "steelyard-cluster: %v\n", err)
		os.Exit(1)
	}
}

func up(state string, nodes int, dual bool) error {
	if err := os.MkdirAll(state, 0o755); err != nil {
		return err
	}
	if pid, err := readPid(state); err == nil && syscall.Kill(pid, 0) == nil {
		return fmt.Errorf("already running (pid %d); `make cluster-down` first", pid)
	}
	_ = os.Remove(filepath.Join(state, "kubeconfig"))
	if err := os.WriteFile(filepath.Join(state, "pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	t0 := time.Now()
	c, err := cluster.Start(ctx, cluster.Options{Nodes: nodes, DualStack: dual, Logf: log.Printf})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(state, "kubeconfig"), []byte(c.CP.Kubeconfig+"\n"), 0o644); err != nil {
		_ = c.Stop()
		return err
	}
	fmt.Println(c.CP.Kubeconfig)
	for _, n := range c.Nodes {
		log.Printf("node %s: InternalIP %s, pods %s, netns %s, zone %q", n.Name, n.IP, n.PodCIDR, n.NS.Name, n.Zone)
		if n.IP6.IsValid() {
			log.Printf("node %s: InternalIP %s, pods %s", n.Name, n.IP6, n.PodCIDR6)
		}
	}
	if c.LAN != nil {
		log.Printf("node LAN %s in netns %s", cluster.NodeLAN, c.LAN.Name)
	}
	log.Printf("cluster up in %v: KUBECONFIG=%s; stop with `make cluster-down`", time.Since(t0).Round(time.Second), c.CP.Kubeconfig)
	<-ctx.Done()
	log.Printf("tearing down")
	err = c.Stop()
	_ = os.Remove(filepath.Join(state, "kubeconfig"))
	_ = os.Remove(filepath.Join(state, "pid"))
	return err
}

func down(state string) error {
	pid, err := readPid(state)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Println("steelyard-cluster: not running")
		return nil
	}
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			_ = os.Remove(filepath.Join(state, "pid"))
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			fmt.Println("steelyard-cluster: stopped")
			return nil
		}
	}
	return fmt.Errorf("pid %d still running after 2 minutes", pid)
}

func readPid(state string) (int, error) {
	b, err := os.ReadFile(filepath.Join(state, "pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
