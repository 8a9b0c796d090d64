package sandbox

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Reply is one answer a UDPStream received.
type Reply struct {
	At   time.Time
	From string // the name the pod answered with
}

// UDPStream is one long-lived UDP flow: a single socket (one 5-tuple, so
// one conntrack entry) sending a datagram to a destination at a fixed
// interval, the way a game, a VoIP call or a QUIC connection does. It
// records who answered each datagram.
type UDPStream struct {
	local netip.AddrPort
	conn  *net.UDPConn
	done  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	replies []Reply
	errs    map[string]int
	sent    int
}

// StartUDPStream starts a flow from this namespace to dst: a datagram every
// interval until Stop, or until maxDuration has passed (a bound, so a
// forgotten stream cannot run on).
func (n *NS) StartUDPStream(dst netip.AddrPort, interval, maxDuration time.Duration) (*UDPStream, error) {
	if err := checkDst(dst); err != nil {
		return nil, err
	}
	if interval <= 0 || maxDuration <= 0 {
		return nil, errors.New("udp stream: interval and maxDuration must be positive")
	}
	var c *net.UDPConn
	err := n.Do(func() error {
		var err error
		for try := 0; try < 10; try++ {
			c, err = net.DialUDP("udp4", &net.UDPAddr{Port: n.udpPort()}, net.UDPAddrFromAddrPort(dst))
			if !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	s := &UDPStream{local: c.LocalAddr().(*net.UDPAddr).AddrPort(), conn: c, done: make(chan struct{}), errs: map[string]int{}}
	s.wg.Add(2)
	go s.send(interval, time.Now().Add(maxDuration))
	go s.receive()
	return s, nil
}

// LocalAddr is the flow's source address and port.
func (s *UDPStream) LocalAddr() netip.AddrPort { return s.local }

func (s *UDPStream) send(interval time.Duration, until time.Time) {
	defer s.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		_, err := s.conn.Write([]byte("ping\n"))
		s.mu.Lock()
		s.sent++
		if err != nil {
			s.errs[errorClass(err)]++
		}
		s.mu.Unlock()
		select {
		case <-s.done:
			return
		case now := <-t.C:
			if now.After(until) {
				return
			}
		}
	}
}

func (s *UDPStream) receive() {
	defer s.wg.Done()
	buf := make([]byte, 512)
	for {
		k, err := s.conn.Read(buf)
		now := time.Now()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// ICMP errors (a refused or unreachable datagram) show here
			// on a connected socket; count them and keep reading.
			s.mu.Lock()
			s.errs[errorClass(err)]++
			s.mu.Unlock()
			time.Sleep(time.Millisecond)
			continue
		}
		s.mu.Lock()
		s.replies = append(s.replies, Reply{At: now, From: strings.TrimSpace(string(buf[:k]))})
		s.mu.Unlock()
	}
}

// Replies returns the answers so far, oldest first.
func (s *UDPStream) Replies() []Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Reply(nil), s.replies...)
}

// Last returns the latest answer (zero Reply when none came yet).
func (s *UDPStream) Last() Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.replies) == 0 {
		return Reply{}
	}
	return s.replies[len(s.replies)-1]
}

// WaitReply waits until an answer after since satisfies ok, and returns
// it; it fails after timeout.
func (s *UDPStream) WaitReply(since time.Time, timeout time.Duration, ok func(Reply) bool) (Reply, error) {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		for _, r := range s.replies {
			if r.At.After(since) && ok(r) {
				s.mu.Unlock()
				return r, nil
			}
		}
		s.mu.Unlock()
		if time.Now().After(deadline) {
			return Reply{}, fmt.Errorf("udp stream %s: no matching answer within %s (%s)", s.local, timeout, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// String summarises the stream: datagrams sent, answers per pod, errors.
func (s *UDPStream) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	counts := map[string]int{}
	for _, r := range s.replies {
		counts[r.From]++
	}
	return fmt.Sprintf("sent %d, answers %v, errors %v", s.sent, counts, s.errs)
}

// Stop ends the stream and closes its socket.
func (s *UDPStream) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	close(s.done)
	s.conn.Close()
	s.wg.Wait()
}
