package cluster

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// connectProxy is kube-apiserver's egress proxy to the node (HTTP CONNECT
// on 127.0.0.1 of the root namespace): each tunnel's socket is created
// inside the node namespace, so kube-apiserver reaches kubelet's
// 198.19.0.1:10250 (exec, logs, port-forward) without a route or an
// interface in the root namespace.
type connectProxy struct {
	ln   net.Listener
	node *sandbox.NS
	wg   sync.WaitGroup
	mu   sync.Mutex
	open map[net.Conn]bool
}

func startConnectProxy(node *sandbox.NS, sock string) (*connectProxy, error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	p := &connectProxy{ln: ln, node: node, open: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *connectProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.tunnel(c)
		}()
	}
}

func (p *connectProxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.open[c] = true
	} else {
		delete(p.open, c)
	}
}

func (p *connectProxy) tunnel(in net.Conn) {
	defer in.Close()
	p.track(in, true)
	defer p.track(in, false)
	_ = in.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(in)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(in, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	var out net.Conn
	err = p.node.Do(func() error {
		var err error
		out, err = net.DialTimeout("tcp", req.Host, 10*time.Second)
		return err
	})
	if err != nil {
		_, _ = io.WriteString(in, "HTTP/1.1 502 Bad Gateway\r\n\r\n"+err.Error())
		return
	}
	defer out.Close()
	p.track(out, true)
	defer p.track(out, false)
	_ = in.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// Bytes the client sent after the CONNECT line sit in br.
		_, _ = io.Copy(out, br)
		if tc, ok := out.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(in, out)
		if uc, ok := in.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

func (p *connectProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
