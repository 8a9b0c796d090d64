package main

// The traffic phase's wire protocol, its backend server and the client's
// measurements. None of it needs root: the unit tests run it on loopback.
//
// The protocol is the smallest request/response exchange that gives both
// figures (connect + first byte, requests per second):
//
//   - on accept the server writes one byte, its backend ID ('a', 'b'): the
//     first byte, which also says which backend the VIP chose;
//   - then, for every byte it reads: 'k' (keep) is answered with 'k';
//     'c' (close) is answered with 'c' and the server closes.
//
// The server closes first, so TIME_WAIT stays on the backend's side (as
// with HTTP's "Connection: close"): tens of thousands of new connections
// from one client to one VIP do not run out of ephemeral ports.

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
			if _, werr := c.Write([]byte{req}); werr != nil || req == reqClose {
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
// byte (the backend ID), ask to close, read the answer and the server's
// close. firstByte is the time from before connect to the first byte.
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
	var b [2]byte
	if _, err := io.ReadFull(c, b[:1]); err != nil {
		return 0, 0, fmt.Errorf("first byte: %w", err)
	}
	firstByte = time.Since(t0)
	id = b[0]
	if _, err := c.Write([]byte{reqClose}); err != nil {
		return id, firstByte, err
	}
	if _, err := io.ReadFull(c, b[:1]); err != nil || b[0] != reqClose {
		return id, firstByte, fmt.Errorf("answer: %q, %v", b[0], err)
	}
	// The server's FIN: EOF here means the server closed first.
	if n, err := c.Read(b[:]); n != 0 || err != io.EOF {
		return id, firstByte, fmt.Errorf("close: read %d bytes, %v (want EOF)", n, err)
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
}

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
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// newConnRate runs workers loops of exchange against addr for d and
// counts the completed requests. ids, when not nil, counts the backend IDs
// seen.
func newConnRate(addr string, workers int, d, timeout time.Duration, ids map[string]int) rate {
	var (
		mu  sync.Mutex
		out rate
		wg  sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for range workers {
		wg.Go(func() {
			var r rate
			seen := map[byte]int{}
			for time.Now().Before(end) {
				id, _, err := exchange(addr, timeout)
				if err != nil {
					r.Errors++
					if r.FirstError == "" {
						r.FirstError = err.Error()
					}
					continue
				}
				r.Requests++
				seen[id]++
			}
			mu.Lock()
			out.add(r)
			for id, k := range seen {
				if ids != nil {
					ids[string(id)] += k
				}
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	out.Seconds = time.Since(start).Seconds()
	return out
}

// keepaliveRate runs workers connections to addr, each asking request
// after request for d, and counts the answers.
func keepaliveRate(addr string, workers int, d, timeout time.Duration) rate {
	var (
		mu  sync.Mutex
		out rate
		wg  sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for range workers {
		wg.Go(func() {
			r := keepalive(addr, end, timeout)
			mu.Lock()
			out.add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	out.Seconds = time.Since(start).Seconds()
	return out
}

// keepalive is one connection's loop of keepalive requests until end.
func keepalive(addr string, end time.Time, timeout time.Duration) (r rate) {
	fail := func(err error) rate {
		r.Errors++
		r.FirstError = err.Error()
		return r
	}
	c, err := net.DialTimeout("tcp4", addr, timeout)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	var b [1]byte
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fail(fmt.Errorf("first byte: %w", err))
	}
	req := []byte{reqKeep}
	for time.Now().Before(end) {
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write(req); err != nil {
			return fail(err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil || b[0] != reqKeep {
			return fail(fmt.Errorf("answer %q: %v", b[0], err))
		}
		r.Requests++
	}
	c.Write([]byte{reqClose})
	return r
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
