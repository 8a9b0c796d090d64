package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// nftWatch follows `nft monitor` in a proxy's namespace and records when
// each endpoint address (endpointRE) first appeared in a rule the kernel
// added to the proxy's table. The kernel sends those events when the
// transaction commits, so the time a line is read is when the address
// reached the kernel: no sync-end attribution and no read-back of the whole
// table per change. (Reading the table back took 0.8-1.4 s for steelyard at
// 1,000 Services: a cleanup sync a second after each change then ended
// during the read, and the old method took that later sync's end; it
// reported 1.05-1.09 s for changes programmed in 50-90 ms.) It was the
// benchmark's method before nftListener and now runs only with
// -compare-nft-monitor, to check that the two agree.
type nftWatch struct {
	cmd   *exec.Cmd
	table string // " ip <table> ", as the event lines name it
	mu    sync.Mutex
	seen  map[string]time.Time
	added chan struct{} // closed and replaced on each new address
	err   error         // why the monitor stopped, once it has
	done  chan struct{}
	// canary is set when the monitor printed ready's rule.
	canary bool
}

// startNFTWatch starts `nft monitor` in namespace ns for table (family ip).
func startNFTWatch(ctx context.Context, ns, table string) (*nftWatch, error) {
	// Only what is added: kube-proxy puts "dnat to IP:PORT" in an
	// endpoint chain's rule, steelyard an element "lo-hi . tcp : IP .
	// PORT" in a Service port's DNAT map (its ports without ClientIP
	// affinity have no endpoint chains). (A plain `nft monitor` of
	// steelyard's table died in nft 1.0.6 with "utils.c:38: Memory
	// allocation failure" after a few changes.)
	what := "rules"
	if table == "steelyard" {
		what = "elements"
	}
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "monitor", "new", what)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	w := &nftWatch{cmd: cmd, table: " ip " + table + " ", seen: map[string]time.Time{}, added: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.read(out)
		err := cmd.Wait()
		w.mu.Lock()
		w.err = fmt.Errorf("%w: nft monitor: %v: %s", errStopped, err, strings.TrimSpace(stderr.String()))
		w.mu.Unlock()
	}()
	return w, nil
}

func (w *nftWatch) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		if strings.HasPrefix(line, "add rule ip "+canaryTable+" ") || strings.HasPrefix(line, "add element ip "+canaryTable+" ") {
			w.mu.Lock()
			w.canary = true
			w.mu.Unlock()
			continue
		}
		if !strings.HasPrefix(line, "add ") || !strings.Contains(line, w.table) || !strings.Contains(line, "198.19.") {
			continue
		}
		var fresh bool
		w.mu.Lock()
		for _, m := range endpointRE.FindAllStringSubmatch(line, -1) {
			if _, ok := w.seen[m[1]]; !ok {
				w.seen[m[1]] = now
				fresh = true
			}
		}
		if fresh {
			close(w.added)
			w.added = make(chan struct{})
		}
		w.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, out)
}

// canaryTable is a table of the benchmark's own that ready adds and deletes
// in the proxy's namespace; neither proxy reads other tables.
const canaryTable = "k8s-bench-canary"

// ready returns once the monitor prints events as they happen. nft monitor
// first reads the whole ruleset into its cache (about a minute for
// steelyard's table at 10,000 Services, through the kernel's quadratic
// dump); an endpoint change committed meanwhile would be printed late, or
// not at all. So a rule is added to a table of our own, again each second,
// until the monitor prints it. (At 10,000 Services nft 1.0.6's monitor was
// not live within 10 minutes for steelyard's table, nor within 2 for
// kube-proxy's: this method serves 1,000, see docs/benchmarks.md.)
func (w *nftWatch) ready(ctx context.Context, ns string) error {
	w.mu.Lock()
	w.canary = false
	w.mu.Unlock()
	return waitCanary(ctx, ns, w.done, func() (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.canary, w.err
	})
}

// waitCanary adds the canary table in namespace ns every second until
// seen reports that a watcher received its events (or an error), done
// closes or ctx ends.
func waitCanary(ctx context.Context, ns string, done <-chan struct{}, seen func() (bool, error)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if err := addCanary(ctx, ns); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		case <-done:
		}
		if ok, err := seen(); ok {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// wait returns when addr first reached the kernel.
func (w *nftWatch) wait(ctx context.Context, addr string) (time.Time, error) {
	return waitSeen(ctx, w.done, func() (time.Time, bool, <-chan struct{}, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		t, ok := w.seen[addr]
		return t, ok, w.added, w.err
	})
}

// waitSeen returns the time look reports for an address once it has one;
// until then it waits for look's added channel (closed at each new event),
// done or ctx.
func waitSeen(ctx context.Context, done <-chan struct{}, look func() (time.Time, bool, <-chan struct{}, error)) (time.Time, error) {
	for {
		t, ok, added, err := look()
		switch {
		case ok:
			return t, nil
		case err != nil:
			return time.Time{}, err
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-added:
		case <-done:
		}
	}
}

// stop ends the monitor.
func (w *nftWatch) stop() {
	if w.cmd.Process != nil {
		_ = w.cmd.Process.Kill()
	}
	<-w.done
}

// addCanary adds a table of the benchmark's own with one rule to namespace
// ns, and deletes it, in one nft run.
func addCanary(ctx context.Context, ns string) error {
	// A rule and an element: a monitor of either kind prints one.
	script := "add table ip " + canaryTable + "\nadd chain ip " + canaryTable + " c\nadd rule ip " + canaryTable + " c counter\n" +
		"add set ip " + canaryTable + " s { type ipv4_addr ; }\nadd element ip " + canaryTable + " s { 198.18.255.1 }\ndelete table ip " + canaryTable + "\n"
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft canary: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
