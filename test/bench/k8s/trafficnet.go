package main

// The traffic phase's wire protocol, its backend server and the client's
// measurements. None of it needs root: the unit tests run it on loopback.
//
// The protocol is the smallest request/response exchange that gives both
// figures (connect + first byte, requests per second):
//
//   - on accept the server writes one byte, its backend ID ('a', 'b'): the
//     first byte, which also says which backend the VIP chose;
//   - then, for every byte it reads: 'k' (keep) is answered with 'k', 'c'
//     (close) with 'c', after which the client closes, and the server
//     closes on EOF.
//
// The client closes first, so TIME_WAIT stays with the client
// (trafficNodeSysctls lets it reuse those ports). When the server closed
// first, a new connection that reused a 4-tuple the backend still held in
// TIME_WAIT sometimes waited for a SYN retransmission (1 s, about 1 in
// 5,000 direct connections, 2026-12-06), and the VIP path escaped most of
// them because NAT picks another source port for a tuple conntrack still
// holds: that skewed VIP vs direct by up to 1.6x.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Protocol bytes.
const (
	reqKeep  = 'k'
	reqClose = 'c'
)

// backendServer is one backend of the traffic Service.
type backendServer struct {
	id byte
	l  net.Listener

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

// serveBackend serves the protocol on l as backend id until close.
func serveBackend(l net.Listener, id byte) *backendServer {
	b := &backendServer{id: id, l: l, conns: map[net.Conn]bool{}}
	b.wg.Add(1)
	go b.accept()
	return b
}

func (b *backendServer) accept() {
	defer b.wg.Done()
	for {
		c, err := b.l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			c.Close()
			return
		}
		b.conns[c] = true
		b.wg.Add(1)
		b.mu.Unlock()
		go b.handle(c)
	}
}

func (b *backendServer) handle(c net.Conn) {
	defer b.wg.Done()
	defer func() {
		c.Close()
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
	}()
	if _, err := c.Write([]byte{b.id}); err != nil {
		return
	}
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		for _, req := range buf[:n] {
			if _, werr := c.Write([]byte{req}); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close stops accepting, closes every connection and waits for the
// goroutines.
func (b *backendServer) close() {
	b.mu.Lock()
	b.closed = true
	b.l.Close()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
	b.wg.Wait()
}

// exchange is one request on a new connection: connect, read the first
// byte (the backend ID), ask to close, read the answer, close. firstByte
// is the time from before connect to the first byte.
func exchange(addr string, timeout time.Duration) (id byte, firstByte time.Duration, err error) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	if err := c.SetDeadline(t0.Add(timeout)); err != nil {
		return 0, 0, err
	}
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, 0, fmt.Errorf("first byte: %w", err)
	}
	firstByte = time.Since(t0)
	id = b[0]
	if _, err := c.Write([]byte{reqClose}); err != nil {
		return id, firstByte, err
	}
	if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != reqClose {
		return id, firstByte, fmt.Errorf("answer: %q, %v", b[0], err)
	}
	return id, firstByte, nil
}

// rate is a count of requests over a time, on one path.
type rate struct {
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	Seconds  float64 `json:"seconds"`
	// FirstError is the first failure's text, to say why errors happened.
	FirstError string `json:"first_error,omitempty"`
	// MaxSeconds is the slowest request; Slow counts the requests over
	// slowRequest (a SYN retransmitted after 1 s shows here).
	MaxSeconds float64 `json:"max_s"`
	Slow       int     `json:"slow"`
}

// slowRequest: a request slower than this counts in rate.Slow.
const slowRequest = 100 * time.Millisecond

func (r rate) perSecond() float64 {
	if r.Seconds <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Seconds
}

func (r *rate) add(o rate) {
	r.Requests += o.Requests
	r.Errors += o.Errors
	r.Seconds += o.Seconds
	r.MaxSeconds = max(r.MaxSeconds, o.MaxSeconds)
	r.Slow += o.Slow
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// requester makes one request on one path (vip or direct) and returns
// the answering backend's ID (new connections) or 0 (keepalive).
type requester interface {
	request(vip bool) (byte, error)
	close()
}

// pairedRates runs workers loops for d. Each iteration makes one request
// on each path, the order alternating, and times each: a path's Seconds is
// the time its requests took, summed over the workers and divided by
// their number, so the two rates share the wall time and every moment's
// load on the machine. ids, when not nil, counts the backend IDs of the
// VIP's answers.
// pairedClock is pairedRates' clock: the wall clock, a virtual one in the
// unit test (real sleeps overshoot on a loaded machine, and the test's
// ratio with them).
var pairedClock = time.Now

func pairedRates(newWorker func() requester, workers int, d time.Duration, ids map[string]int) (vip, direct rate) {
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	end := pairedClock().Add(d)
	for range workers {
		wg.Go(func() {
			var r [2]rate // direct, VIP
			var spent [2]time.Duration
			seen := map[byte]int{}
			req := newWorker()
			defer req.close()
			for i := 0; pairedClock().Before(end); i++ {
				for k := range 2 {
					path := (i + k) % 2 // 1: VIP
					t := pairedClock()
					id, err := req.request(path == 1)
					took := pairedClock().Sub(t)
					spent[path] += took
					r[path].MaxSeconds = max(r[path].MaxSeconds, took.Seconds())
					if took > slowRequest {
						r[path].Slow++
					}
					if err != nil {
						r[path].Errors++
						if r[path].FirstError == "" {
							r[path].FirstError = err.Error()
						}
						continue
					}
					r[path].Requests++
					if path == 1 && id != 0 {
						seen[id]++
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for path := range 2 {
				r[path].Seconds = spent[path].Seconds() / float64(workers)
			}
			direct.add(r[0])
			vip.add(r[1])
			for id, k := range seen {
				if ids != nil {
					ids[string(id)] += k
				}
			}
		})
	}
	wg.Wait()
	return vip, direct
}

// newConns makes each request on a new connection (exchange).
type newConns struct {
	vip, direct string
	timeout     time.Duration
}

func (n newConns) request(vip bool) (byte, error) {
	addr := n.direct
	if vip {
		addr = n.vip
	}
	id, _, err := exchange(addr, n.timeout)
	return id, err
}

func (newConns) close() {}

// keepaliveConns makes each request on one connection per path, opened
// at the first request and again after a failure.
type keepaliveConns struct {
	addr    [2]string // direct, VIP
	timeout time.Duration
	conns   [2]net.Conn
}

func (k *keepaliveConns) request(vip bool) (byte, error) {
	path := 0
	if vip {
		path = 1
	}
	var b [1]byte
	c := k.conns[path]
	if c == nil {
		var err error
		if c, err = net.DialTimeout("tcp4", k.addr[path], k.timeout); err != nil {
			return 0, err
		}
		c.SetDeadline(time.Now().Add(k.timeout))
		if _, err := io.ReadFull(c, b[:]); err != nil {
			c.Close()
			return 0, fmt.Errorf("first byte: %w", err)
		}
		k.conns[path] = c
	}
	c.SetDeadline(time.Now().Add(k.timeout))
	_, err := c.Write([]byte{reqKeep})
	if err == nil {
		_, err = io.ReadFull(c, b[:])
	}
	if err != nil || b[0] != reqKeep {
		c.Close()
		k.conns[path] = nil
		return 0, fmt.Errorf("answer %q: %v", b[0], err)
	}
	return 0, nil
}

func (k *keepaliveConns) close() {
	for _, c := range k.conns {
		if c != nil {
			c.Write([]byte{reqClose})
			c.Close()
		}
	}
}

// waitAnswer retries exchange with addr until one succeeds or ctx ends;
// it returns how long that took, or the last error.
func waitAnswer(ctx context.Context, addr string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	var last error
	for {
		_, _, err := exchange(addr, timeout)
		if err == nil {
			return time.Since(start), nil
		}
		last = err
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("no answer from %s within %v: last error: %w", addr, time.Since(start).Round(time.Second), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
