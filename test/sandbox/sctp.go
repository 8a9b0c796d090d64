package sandbox

// SCTP traffic. Go's standard library has no SCTP, so these helpers use the
// socket system calls directly: one-to-one style sockets (SOCK_STREAM,
// IPPROTO_SCTP), which accept, connect, read, write and close like TCP.
// A kernel without the sctp module refuses socket() with
// EPROTONOSUPPORT; the suites that use these run in the VM, which loads it.
//
// Timeouts are the sockets' own (SO_SNDTIMEO bounds connect, SO_RCVTIMEO
// accept and read), so no call blocks for longer than the Load allows and
// a server notices Close within acceptPoll.

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// acceptPoll is how long one accept waits before the server checks whether
// it was closed.
const acceptPoll = 200 * time.Millisecond

// SCTPServer answers every SCTP association on one port of a pod with the
// pod's name and a newline, then closes it (SHUTDOWN, no linger).
type SCTPServer struct {
	pod      *Pod
	fd       int
	closed   atomic.Bool
	accepted atomic.Int64
	wg       sync.WaitGroup
	once     sync.Once
}

// ServeSCTP starts an SCTP server on 0.0.0.0:port in the pod's namespace.
// Stopping the pod (Sandbox.Close) stops it too.
func (p *Pod) ServeSCTP(port uint16) (*SCTPServer, error) {
	s := &SCTPServer{pod: p, fd: -1}
	err := p.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("sctp socket (is the sctp module loaded?): %w", err)
		}
		s.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(port)}); err != nil {
			return fmt.Errorf("sctp bind :%d: %w", port, err)
		}
		if err := unix.Listen(fd, 128); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(acceptPoll.Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		return nil, fmt.Errorf("sandbox: pod %s: %w", p.Name, err)
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		unix.Close(s.fd)
		return nil, fmt.Errorf("sandbox: pod %s is stopped", p.Name)
	}
	p.sctp = append(p.sctp, s)
	p.mu.Unlock()
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

func (s *SCTPServer) serve() {
	defer s.wg.Done()
	reply := []byte(s.pod.Name + "\n")
	for !s.closed.Load() {
		c, _, err := unix.Accept4(s.fd, unix.SOCK_CLOEXEC)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
				continue
			}
			return
		}
		s.accepted.Add(1)
		// The reply fits the socket buffer: the write does not block.
		unix.Write(c, reply)
		unix.Close(c)
	}
}

// Accepted returns how many associations the server accepted.
func (s *SCTPServer) Accepted() int64 { return s.accepted.Load() }

// Close stops the server (within acceptPoll) and closes its socket.
func (s *SCTPServer) Close() {
	s.once.Do(func() {
		s.closed.Store(true)
		s.wg.Wait()
		unix.Close(s.fd)
	})
}

// SCTPConns opens count SCTP associations from this namespace to dst (at
// most load.Concurrency at a time) and counts which pod answered each. An
// association that does not connect or answer within load.Timeout counts
// as "timeout".
func (n *NS) SCTPConns(dst netip.AddrPort, count int, load Load) (Result, error) {
	if err := checkDst(dst); err != nil {
		return Result{}, err
	}
	load = load.withDefaults()
	return n.run("sctp", dst, count, load, func() (string, error) { return sctpFirstLine(dst, load.Timeout) })
}

// sctpFirstLine connects to dst from the calling thread's namespace, reads
// the first line and closes. The socket is non-blocking and every wait is a
// poll against one deadline, so signals (EINTR) cannot stretch it.
func sctpFirstLine(dst netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return "", fmt.Errorf("sctp socket: %w", err)
	}
	defer unix.Close(fd)
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return "", err
	}
	if err != nil {
		if err := waitFD(fd, unix.POLLOUT, deadline); err != nil {
			return "", err
		}
		if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
			return "", err
		} else if soErr != 0 {
			return "", unix.Errno(soErr)
		}
	}
	var line []byte
	buf := make([]byte, 256)
	for bytes.IndexByte(line, '\n') < 0 {
		k, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
			if err := waitFD(fd, unix.POLLIN, deadline); err != nil {
				return "", err
			}
			continue
		case err != nil:
			return "", err
		case k == 0:
			return "", errEOFBeforeLine
		}
		line = append(line, buf[:k]...)
	}
	return string(bytes.TrimSpace(line[:bytes.IndexByte(line, '\n')])), nil
}

// waitFD polls fd for events until deadline; os.ErrDeadlineExceeded after.
func waitFD(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n > 0:
			return nil // ready, or an error the next call reports
		}
	}
}

var errEOFBeforeLine = errors.New("EOF before the first line")
