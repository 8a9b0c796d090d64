package sandbox

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// proberLimit bounds a Prober whose Stop is never reached.
const proberLimit = 30 * time.Minute

// Prober opens a new TCP connection from one namespace to one address at a
// fixed interval until Stop: the chaos tests' "new connections all along",
// which must not fail while the agent is killed and restarted.
type Prober struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	errs       []string
	stop, done chan struct{}
	once       sync.Once
}

// StartProber dials dst from n every interval, each dial bounded by
// timeout, until Stop (or proberLimit).
func (n *NS) StartProber(dst netip.AddrPort, interval, timeout time.Duration) *Prober {
	p := &Prober{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		limit := time.After(proberLimit)
		for {
			select {
			case <-p.stop:
				return
			case <-limit:
				return
			case <-tick.C:
			}
			if _, err := n.Dial("tcp", dst, timeout); err != nil {
				p.failed.Add(1)
				p.mu.Lock()
				p.errs = append(p.errs, time.Now().Format("15:04:05.000")+" "+err.Error())
				p.mu.Unlock()
			} else {
				p.ok.Add(1)
			}
		}
	}()
	return p
}

// Stop ends the probing (it may be called more than once) and returns how
// many connections succeeded and the failures, each with its time.
func (p *Prober) Stop() (ok int64, failures []string) {
	p.once.Do(func() { close(p.stop) })
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok.Load(), append([]string(nil), p.errs...)
}
