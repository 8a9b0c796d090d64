package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Pod is a pod namespace and the servers that answer in it.
type Pod struct {
	Name  string
	IP    netip.Addr
	Ports []uint16
	// NS is the pod's namespace; use it as a client for hairpin tests.
	NS *NS
	// Veth is the node-side interface ("syp<n>").
	Veth string

	accepted  atomic.Int64
	datagrams atomic.Int64

	mu        sync.Mutex
	listeners []net.Listener
	packets   []net.PacketConn
	sctp      []*SCTPServer // ServeSCTP's
	conns     map[net.Conn]bool
	stopped   bool
	wg        sync.WaitGroup
}

// Accepted returns how many TCP connections the pod's servers accepted.
func (p *Pod) Accepted() int64 { return p.accepted.Load() }

// Datagrams returns how many UDP datagrams the pod's servers answered.
func (p *Pod) Datagrams() int64 { return p.datagrams.Load() }

// start opens the sockets inside the pod namespace and serves them from
// ordinary goroutines: a socket stays in the namespace it was created in.
func (p *Pod) start() error {
	p.conns = map[net.Conn]bool{}
	err := p.NS.Do(func() error {
		for _, port := range p.Ports {
			addr := fmt.Sprintf("0.0.0.0:%d", port)
			l, err := net.Listen("tcp4", addr)
			if err != nil {
				return err
			}
			p.listeners = append(p.listeners, l)
			pc, err := net.ListenPacket("udp4", addr)
			if err != nil {
				return err
			}
			p.packets = append(p.packets, pc)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, l := range p.listeners {
		p.wg.Add(1)
		go p.serveTCP(l)
	}
	for _, pc := range p.packets {
		p.wg.Add(1)
		go p.serveUDP(pc)
	}
	return nil
}

func (p *Pod) serveTCP(l net.Listener) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed by stop
		}
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.conns[c] = true
		p.mu.Unlock()
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.handle(c)
	}
}

// handle greets with the pod name, then echoes lines until EOF.
func (p *Pod) handle(c net.Conn) {
	defer p.wg.Done()
	defer func() {
		c.Close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	if _, err := c.Write([]byte(p.Name + "\n")); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := c.Write(line); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// serveUDP answers every datagram with the pod name.
func (p *Pod) serveUDP(pc net.PacketConn) {
	defer p.wg.Done()
	buf := make([]byte, 2048)
	reply := []byte(p.Name + "\n")
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		p.datagrams.Add(1)
		pc.WriteTo(reply, from)
	}
}

// stop closes the servers and their connections and waits for them.
func (p *Pod) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	for _, l := range p.listeners {
		l.Close()
	}
	for _, pc := range p.packets {
		pc.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	sctp := p.sctp
	p.mu.Unlock()
	for _, s := range sctp {
		s.Close()
	}
	p.wg.Wait()
}
