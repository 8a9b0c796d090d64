package sandbox

import (
	"io"
	"net"
	"net/netip"
	"sync"
)

// Forward opens a TCP listener at listen inside namespace n and relays every
// connection to target, dialled from the test process's own namespace.
//
// Why: an agent in the node namespace must reach a kube-apiserver that
// listens on 127.0.0.1 of the test's namespace, and nothing may be added to
// the machine's root namespace (no veth, no route). The listener socket is
// created inside n (sockets keep the namespace they were created in), the
// dial happens outside, and the bytes are copied in between.
func (n *NS) Forward(listen netip.AddrPort, target string) (stop func(), err error) {
	var ln net.Listener
	if err := n.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", listen.String())
		return err
	}); err != nil {
		return nil, err
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn, add bool) {
		mu.Lock()
		defer mu.Unlock()
		if add {
			conns[c] = true
		} else {
			delete(conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := net.Dial("tcp", target)
				if err != nil {
					in.Close()
					return
				}
				track(in, true)
				track(out, true)
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					if tc, ok := dst.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
					done <- struct{}{}
				}
				go pipe(out, in)
				go pipe(in, out)
				<-done
				<-done
				in.Close()
				out.Close()
				track(in, false)
				track(out, false)
			}()
		}
	}()
	return func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}, nil
}
