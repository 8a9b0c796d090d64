package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// TrafficRange is the only destination range the traffic helpers accept:
// the sandbox's own addresses (VIPs, node, pods, clients).
var TrafficRange = netip.MustParsePrefix("198.18.0.0/15")

// Load bounds a run of connections or flows. The zero value is fine.
type Load struct {
	// Concurrency is how many connections are in flight; default 32.
	Concurrency int
	// Timeout bounds one connection: dial plus the first line (TCP), or the
	// datagram and its answer (UDP); default 2s.
	Timeout time.Duration
	// MaxDuration stops handing out new connections after this long, so a
	// broken dataplane cannot make a run hang; default 2m.
	MaxDuration time.Duration
	// GracefulClose makes TCPConns close with FIN instead of RST. With FIN
	// the client is the active closer and keeps every connection in
	// TIME_WAIT for 60 s; past ~25,000 of them the kernel's ephemeral port
	// search slows down tenfold (measured: 6,000/s fell to 650/s).
	GracefulClose bool
}

func (l Load) withDefaults() Load {
	if l.Concurrency <= 0 {
		l.Concurrency = 32
	}
	if l.Timeout <= 0 {
		l.Timeout = 2 * time.Second
	}
	if l.MaxDuration <= 0 {
		l.MaxDuration = 2 * time.Minute
	}
	return l
}

// Result counts the answers of a run per pod name.
type Result struct {
	// Dst is the address the run targeted and Proto "tcp" or "udp".
	Dst   netip.AddrPort
	Proto string
	// Requested is how many connections were asked for; Attempted how many
	// were made before MaxDuration ran out.
	Requested, Attempted int
	// Counts maps the name a pod answered with to how often it did.
	Counts map[string]int
	// Errors maps a short error class ("connection refused", "timeout",
	// ...) to how often it happened.
	Errors  map[string]int
	Elapsed time.Duration
	// FailedAt holds when the first failures ended, from the run's
	// start (at most 50): failures at one moment point at a stall, spread
	// ones at a steady loss.
	FailedAt []time.Duration
}

// OK returns the number of answered connections.
func (r Result) OK() int {
	n := 0
	for _, c := range r.Counts {
		n += c
	}
	return n
}

// Failed returns the number of connections that got no answer.
func (r Result) Failed() int {
	n := 0
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// Share returns the percentage of answered connections that name got.
func (r Result) Share(name string) float64 {
	ok := r.OK()
	if ok == 0 {
		return 0
	}
	return 100 * float64(r.Counts[name]) / float64(ok)
}

// Rate returns attempted connections per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Attempted) / r.Elapsed.Seconds()
}

// Names returns the pod names that answered, sorted.
func (r Result) Names() []string {
	names := make([]string, 0, len(r.Counts))
	for n := range r.Counts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// String renders "tcp 198.18.0.10:80: 20000/20000 ok in 3.1s (6400/s): web-1 10.05%  web-2 89.95%".
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d/%d ok in %s (%.0f/s):", r.Proto, r.Dst, r.OK(), r.Requested,
		r.Elapsed.Round(time.Millisecond), r.Rate())
	for _, n := range r.Names() {
		fmt.Fprintf(&b, "  %s %.2f%%", n, r.Share(n))
	}
	if len(r.Errors) > 0 {
		keys := make([]string, 0, len(r.Errors))
		for k := range r.Errors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString("  errors:")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, r.Errors[k])
		}
	}
	return b.String()
}

func checkDst(dst netip.AddrPort) error {
	if !dst.IsValid() || !TrafficRange.Contains(dst.Addr()) || dst.Port() == 0 {
		return fmt.Errorf("sandbox: destination %s is outside %s", dst, TrafficRange)
	}
	return nil
}

// TCPConns opens count TCP connections from this namespace to dst (at most
// load.Concurrency at once), reads the first line of each (the pod name),
// closes it, and counts the names. Connections are closed with RST
// (SO_LINGER 0) unless load.GracefulClose: the client then keeps no
// TIME_WAIT, and the node's conntrack entry closes at once (a reused source
// port later starts a new conntrack entry and a new backend choice, as
// after TIME_WAIT).
func (n *NS) TCPConns(dst netip.AddrPort, count int, load Load) (Result, error) {
	if err := checkDst(dst); err != nil {
		return Result{}, err
	}
	load = load.withDefaults()
	d := net.Dialer{Timeout: load.Timeout}
	return n.run("tcp", dst, count, load, func() (string, error) {
		c, err := d.Dial("tcp4", dst.String())
		if err != nil {
			return "", err
		}
		if !load.GracefulClose {
			c.(*net.TCPConn).SetLinger(0)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(load.Timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(line), nil
	})
}

// UDP source ports handed out by UDPFlows, per namespace. Each flow binds
// the next one, so no two flows of a sandbox share a 5-tuple (and with it a
// conntrack entry, which would send the second to the first one's backend)
// until the range wraps.
const (
	udpPortFirst = 20000
	udpPortCount = 40000
)

func (n *NS) udpPort() int {
	return udpPortFirst + int(n.nextUDPPort.Add(1)-1)%udpPortCount
}

// UDPFlows sends count datagrams from this namespace to dst, each from a
// new socket with its own source port (a new flow for conntrack), waits for
// the answer and counts the names.
func (n *NS) UDPFlows(dst netip.AddrPort, count int, load Load) (Result, error) {
	if err := checkDst(dst); err != nil {
		return Result{}, err
	}
	load = load.withDefaults()
	raddr := net.UDPAddrFromAddrPort(dst)
	return n.run("udp", dst, count, load, func() (string, error) {
		var c *net.UDPConn
		var err error
		for try := 0; try < 10; try++ {
			c, err = net.DialUDP("udp4", &net.UDPAddr{Port: n.udpPort()}, raddr)
			if !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
		}
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(load.Timeout))
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return "", err
		}
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:k])), nil
	})
}

// run hands count jobs to load.Concurrency workers, each locked in the
// namespace for the whole run, and merges their counts.
func (n *NS) run(proto string, dst netip.AddrPort, count int, load Load, one func() (string, error)) (Result, error) {
	res := Result{Dst: dst, Proto: proto, Requested: count, Counts: map[string]int{}, Errors: map[string]int{}}
	jobs := make(chan struct{})
	type partial struct {
		counts, errs map[string]int
		failedAt     []time.Duration
		done         int
		err          error
	}
	parts := make(chan partial, load.Concurrency)
	start := time.Now()
	for w := 0; w < load.Concurrency; w++ {
		go func() {
			p := partial{counts: map[string]int{}, errs: map[string]int{}}
			p.err = n.Do(func() error {
				for range jobs {
					p.done++
					name, err := one()
					if err != nil {
						p.errs[errorClass(err)]++
						if len(p.failedAt) < 50 {
							p.failedAt = append(p.failedAt, time.Since(start))
						}
						continue
					}
					p.counts[name]++
				}
				return nil
			})
			if p.err != nil {
				for range jobs { // keep the producer going; count as failures
					p.done++
					p.errs["cannot enter namespace"]++
				}
			}
			parts <- p
		}()
	}
	deadline := start.Add(load.MaxDuration)
	for i := 0; i < count && time.Now().Before(deadline); i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	var firstErr error
	for w := 0; w < load.Concurrency; w++ {
		p := <-parts
		res.Attempted += p.done
		for k, v := range p.counts {
			res.Counts[k] += v
		}
		for k, v := range p.errs {
			res.Errors[k] += v
		}
		res.FailedAt = append(res.FailedAt, p.failedAt...)
		if p.err != nil && firstErr == nil {
			firstErr = p.err
		}
	}
	res.Elapsed = time.Since(start)
	slices.Sort(res.FailedAt)
	if len(res.FailedAt) > 50 {
		res.FailedAt = res.FailedAt[:50]
	}
	if firstErr == nil && res.Attempted < count {
		firstErr = fmt.Errorf("%s %s: stopped after %s with %d of %d connections", proto, dst, load.MaxDuration, res.Attempted, count)
	}
	return res, firstErr
}

// errorClass shortens err to a countable class. A timeout names the
// operation that ran out ("dial timeout": no SYN-ACK; "read timeout":
// connected, no answer), which tells a lost SYN from a lost reply.
func errorClass(err error) string {
	var errno syscall.Errno
	var op *net.OpError
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) && errors.As(err, &op):
		return op.Op + " timeout"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.As(err, &errno):
		return errno.Error()
	case errors.Is(err, io.EOF):
		return "EOF before the first line"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return err.Error()
}

// Dial makes one attempt from this namespace and returns its error and how
// long it took. proto "tcp": connect (and close at once). proto "udp": a
// connected socket sends one datagram and waits for the answer, so an ICMP
// port unreachable shows as ECONNREFUSED. Check the error with
// errors.Is(err, syscall.ECONNREFUSED).
func (n *NS) Dial(proto string, dst netip.AddrPort, timeout time.Duration) (time.Duration, error) {
	if err := checkDst(dst); err != nil {
		return 0, err
	}
	var elapsed time.Duration
	err := n.Do(func() error {
		start := time.Now()
		defer func() { elapsed = time.Since(start) }()
		switch proto {
		case "tcp":
			c, err := net.DialTimeout("tcp4", dst.String(), timeout)
			if err != nil {
				return err
			}
			return c.Close()
		case "udp":
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(start.Add(timeout))
			if _, err := c.Write([]byte("hello\n")); err != nil {
				return err
			}
			_, err = c.Read(make([]byte, 512))
			return err
		default:
			return fmt.Errorf("dial: unknown protocol %q", proto)
		}
	})
	return elapsed, err
}

// Conn is a long-lived TCP connection to a pod (through a VIP or not).
type Conn struct {
	// Backend is the name the pod greeted with.
	Backend string
	ns      *NS
	conn    net.Conn
	r       *bufio.Reader
}

// Connect opens a TCP connection from this namespace to dst and reads the
// greeting. The sandbox closes it on Close if the caller has not.
func (n *NS) Connect(dst netip.AddrPort, timeout time.Duration) (*Conn, error) {
	if err := checkDst(dst); err != nil {
		return nil, err
	}
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", dst.String(), timeout)
		return err
	})
	if err != nil {
		return nil, err
	}
	conn := &Conn{ns: n, conn: c, r: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(timeout))
	line, err := conn.r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("greeting from %s: %w", dst, err)
	}
	c.SetDeadline(time.Time{})
	conn.Backend = strings.TrimSpace(line)
	n.mu.Lock()
	if n.conns == nil {
		n.mu.Unlock()
		c.Close()
		return nil, fmt.Errorf("namespace %s is closed", n.Name)
	}
	n.conns[conn] = true
	n.mu.Unlock()
	return conn, nil
}

// Echo sends msg (one line) and expects it back within timeout.
func (c *Conn) Echo(msg string, timeout time.Duration) error {
	if strings.ContainsRune(msg, '\n') {
		return errors.New("echo: one line only")
	}
	c.conn.SetDeadline(time.Now().Add(timeout))
	defer c.conn.SetDeadline(time.Time{})
	if _, err := c.conn.Write([]byte(msg + "\n")); err != nil {
		return fmt.Errorf("echo via %s: write: %w", c.Backend, err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo via %s: read: %w", c.Backend, err)
	}
	if got := strings.TrimSuffix(line, "\n"); got != msg {
		return fmt.Errorf("echo via %s: sent %q, got %q", c.Backend, msg, got)
	}
	return nil
}

// LocalAddr and RemoteAddr are the connection's addresses as the client sees them.
func (c *Conn) LocalAddr() net.Addr  { return c.conn.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.conn.RemoteAddr() }

// Close closes the connection.
func (c *Conn) Close() error {
	c.ns.mu.Lock()
	delete(c.ns.conns, c)
	c.ns.mu.Unlock()
	return c.conn.Close()
}
