package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// nftListener receives the kernel's nf_tables notifications in a proxy's
// network namespace (a NETLINK_NETFILTER socket in the NFNLGRP_NFTABLES
// group) and records when each pod-range address first arrived in a new
// rule, set element or chain of the proxy's table. The kernel multicasts
// those messages when a transaction commits, so their receipt is when the
// change reached the kernel. Unlike `nft monitor` it keeps no cache and
// reads no ruleset: it is live as soon as the socket is bound (nft 1.0.6's
// monitor was not live within 10 minutes at 10,000 Services).
type nftListener struct {
	fd    int
	table string

	mu    sync.Mutex
	seen  map[netip.Addr]time.Time
	added chan struct{} // closed and replaced on each new address
	err   error         // why the listener stopped, once it has
	// canary is set when an event of canaryTable arrived (ready).
	canary bool

	// Counters, read with atomic loads.
	datagrams atomic.Int64
	messages  atomic.Int64 // NEWCHAIN, NEWRULE, NEWSETELEM of the table
	gens      atomic.Int64 // NEWGEN: committed transactions (any table)
	overruns  atomic.Int64 // ENOBUFS: the kernel dropped notifications

	stopping atomic.Bool
	done     chan struct{}
	// raw, when set before the first datagram (capture_test.go), gets a
	// copy of each datagram.
	raw func([]byte)
}

// listenerRcvBuf is the socket's receive buffer (SO_RCVBUFFORCE, past
// net.core.rmem_max). One notification per rule is queued at commit; an
// endpoint change is a few dozen, a full sync of 10,000 Services hundreds
// of thousands, which overrun any buffer (counted, see overruns).
const listenerRcvBuf = 64 << 20

// startNFTListener opens the socket inside namespace ns and starts reading.
func startNFTListener(ns *sandbox.NS, table string) (*nftListener, error) {
	return startNFTListenerRaw(ns, table, nil)
}

// startNFTListenerRaw is startNFTListener passing every datagram to raw too.
func startNFTListenerRaw(ns *sandbox.NS, table string, raw func([]byte)) (*nftListener, error) {
	fd := -1
	err := ns.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	setup := func() error {
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, nfnlgrpNFTables); err != nil {
			return fmt.Errorf("join NFNLGRP_NFTABLES: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, listenerRcvBuf); err != nil {
			return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
		}
		// A receive timeout lets stop end the reader (closing a socket
		// does not wake a recvfrom blocked on it).
		tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if err := setup(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	l := &nftListener{fd: fd, table: table, seen: map[netip.Addr]time.Time{}, added: make(chan struct{}), done: make(chan struct{}), raw: raw}
	go l.read()
	return l, nil
}

func (l *nftListener) read() {
	defer close(l.done)
	defer unix.Close(l.fd)
	buf := make([]byte, 1<<20)
	for !l.stopping.Load() {
		n, _, err := unix.Recvfrom(l.fd, buf, 0)
		now := time.Now()
		switch {
		case errors.Is(err, unix.ENOBUFS):
			// The queue overflowed and the kernel dropped
			// notifications; the socket goes on with the next ones.
			l.overruns.Add(1)
			continue
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			l.mu.Lock()
			l.err = fmt.Errorf("%w: recvfrom: %v", errStopped, err)
			l.mu.Unlock()
			return
		}
		l.datagrams.Add(1)
		if l.raw != nil {
			l.raw(append([]byte(nil), buf[:n]...))
		}
		l.record(parseNFTMessages(buf[:n]), now)
	}
	l.mu.Lock()
	l.err = fmt.Errorf("%w: stopped", errStopped)
	l.mu.Unlock()
}

// record notes the addresses of the proxy table's events, received at now.
func (l *nftListener) record(evs []nftEvent, now time.Time) {
	var fresh bool
	l.mu.Lock()
	for _, ev := range evs {
		if ev.msg == nftMsgNewGen {
			l.gens.Add(1)
			continue
		}
		if ev.table == canaryTable {
			l.canary = true
			continue
		}
		if ev.table != l.table {
			continue
		}
		l.messages.Add(1)
		for _, a := range ev.addrs {
			if _, ok := l.seen[a]; !ok {
				l.seen[a] = now
				fresh = true
			}
		}
	}
	if fresh {
		close(l.added)
		l.added = make(chan struct{})
	}
	l.mu.Unlock()
}

// ready returns once the listener has received the events of a table of
// the benchmark's own (canaryTable) added and deleted in namespace ns: the
// socket is in the right namespace and group. It is live from the start
// (no cache to fill), so this takes one nft run, not minutes.
func (l *nftListener) ready(ctx context.Context, ns string) error {
	return waitCanary(ctx, ns, l.done, func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.canary, l.err
	})
}

// errStopped wraps the error of a kernel watch that stopped.
var errStopped = errors.New("kernel event watch stopped")

// wait returns when addr first reached the kernel.
func (l *nftListener) wait(ctx context.Context, addr string) (time.Time, error) {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return time.Time{}, err
	}
	return waitSeen(ctx, l.done, func() (time.Time, bool, <-chan struct{}, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		t, ok := l.seen[a]
		return t, ok, l.added, l.err
	})
}

// stats is a snapshot of the counters.
type listenerStats struct {
	datagrams, messages, gens, overruns int64
}

func (l *nftListener) stats() listenerStats {
	return listenerStats{l.datagrams.Load(), l.messages.Load(), l.gens.Load(), l.overruns.Load()}
}

func (s listenerStats) minus(b listenerStats) listenerStats {
	return listenerStats{s.datagrams - b.datagrams, s.messages - b.messages, s.gens - b.gens, s.overruns - b.overruns}
}

// stop ends the reader (within the receive timeout) and closes the socket.
func (l *nftListener) stop() {
	l.stopping.Store(true)
	<-l.done
}
