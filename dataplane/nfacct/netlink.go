package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The wire format, encoded here rather than through a general netlink
// library so that many requests share one socket: a request is a netlink
// header, the nfnetlink header (family, version, resource id) and one
// NFACCT_NAME attribute.

const (
	sizeofHeader = unix.SizeofNlMsghdr // 16
	sizeofNfgen  = 4
	// sizeofErr is an NLMSG_ERROR payload with the request capped to its
	// header (NETLINK_CAP_ACK): the errno, then the request's header.
	sizeofErr = 4 + sizeofHeader
)

// BatchSize is how many requests go out in one send before their acks
// are read: 64 acks take about 50 KB of the socket's receive buffer
// (about 768 bytes of kernel memory each), well under its default 208 KB,
// so the kernel never drops one (it would, silently but for ENOBUFS).
var BatchSize = 64

func align4(n int) int { return (n + 3) &^ 3 }

// appendRequest appends one request for the accounting subsystem: message
// type msg, flags, sequence number seq, and the name attribute unless name
// is empty (a dump of every object).
func appendRequest(b []byte, msg uint16, flags uint16, seq uint32, name string) []byte {
	attrLen := 0
	if name != "" {
		attrLen = 4 + len(name) + 1
	}
	total := sizeofHeader + sizeofNfgen + align4(attrLen)
	start := len(b)
	b = append(b, make([]byte, total)...)
	m := b[start:]
	ne := binary.NativeEndian
	ne.PutUint32(m[0:], uint32(total))
	ne.PutUint16(m[4:], subsysAcct<<8|msg)
	ne.PutUint16(m[6:], flags)
	ne.PutUint32(m[8:], seq)
	// m[12:16]: port id 0, the kernel.
	m[16] = unix.AF_UNSPEC
	m[17] = 0 // NFNETLINK_V0; m[18:20] resource id 0 (big endian)
	if name != "" {
		a := m[sizeofHeader+sizeofNfgen:]
		ne.PutUint16(a[0:], uint16(attrLen))
		ne.PutUint16(a[2:], attrName)
		copy(a[4:], name) // the NUL and the padding are already zero
	}
	return b
}

// message is one netlink message of a received buffer.
type message struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte // after the netlink header
}

// parseMessages splits a received buffer into its messages.
func parseMessages(b []byte) ([]message, error) {
	var out []message
	ne := binary.NativeEndian
	for len(b) > 0 {
		if len(b) < sizeofHeader {
			return nil, fmt.Errorf("nfacct: %d bytes left, shorter than a netlink header", len(b))
		}
		n := int(ne.Uint32(b[0:]))
		if n < sizeofHeader || n > len(b) {
			return nil, fmt.Errorf("nfacct: netlink message of length %d in %d bytes", n, len(b))
		}
		out = append(out, message{typ: ne.Uint16(b[4:]), flags: ne.Uint16(b[6:]), seq: ne.Uint32(b[8:]), data: b[sizeofHeader:n]})
		b = b[min(align4(n), len(b)):]
	}
	return out, nil
}

// ackErrno decodes an NLMSG_ERROR payload: 0 for a plain ack, else the
// kernel's errno.
func ackErrno(data []byte) (syscall.Errno, error) {
	if len(data) < 4 {
		return 0, fmt.Errorf("nfacct: netlink error message of %d bytes", len(data))
	}
	return syscall.Errno(-int32(binary.NativeEndian.Uint32(data))), nil
}

// conn is one NETLINK_NETFILTER socket in the network namespace of the
// thread that opened it (a socket stays in its namespace).
type conn struct {
	fd  int
	seq uint32
	buf []byte
}

func dial() (*conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nfacct: netlink socket: %w", err)
	}
	// Acks of errors without the request they answer: smaller, and the
	// sequence number says which request it was.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	// Room for a dump's large messages; the kernel caps it at rmem_max.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nfacct: bind netlink socket: %w", err)
	}
	return &conn{fd: fd, seq: uint32(os.Getpid()) << 8, buf: make([]byte, 1<<17)}, nil
}

func (c *conn) close() { unix.Close(c.fd) }

// recv reads one datagram and returns its messages, checking that it came
// from the kernel and was not cut short.
func (c *conn) recv() ([]message, error) {
	for {
		n, _, flags, from, err := unix.Recvmsg(c.fd, c.buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// ENOBUFS: the kernel dropped messages for this socket.
			return nil, fmt.Errorf("nfacct: netlink receive: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return nil, fmt.Errorf("nfacct: netlink message larger than %d bytes", len(c.buf))
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not from the kernel
		}
		return parseMessages(c.buf[:n])
	}
}

// exchange sends one request per name (type msg, flags plus
// NLM_F_REQUEST|NLM_F_ACK), BatchSize to a send, and returns the kernel's
// answer to each, in the order of names: 0 or an errno. An error means
// the exchange itself failed; which requests the kernel applied is then
// unknown, and the answers hold what was read so far (unset ones are
// errUnknown).
func (c *conn) exchange(msg uint16, flags uint16, names []string) ([]syscall.Errno, error) {
	answers := make([]syscall.Errno, len(names))
	for i := range answers {
		answers[i] = errUnknown
	}
	var out []byte
	for start := 0; start < len(names); start += BatchSize {
		end := min(start+BatchSize, len(names))
		base := c.seq
		c.seq += uint32(end - start)
		out = out[:0]
		for i := start; i < end; i++ {
			out = appendRequest(out, msg, flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK, base+uint32(i-start), names[i])
		}
		if err := unix.Sendto(c.fd, out, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return answers, fmt.Errorf("nfacct: netlink send: %w", err)
		}
		for pending := end - start; pending > 0; {
			msgs, err := c.recv()
			if err != nil {
				return answers, err
			}
			for _, m := range msgs {
				// Below base, the difference wraps to a large number.
				if m.typ != unix.NLMSG_ERROR || m.seq-base >= uint32(end-start) {
					continue // a late answer to an earlier exchange
				}
				k := int(m.seq - base)
				e, err := ackErrno(m.data)
				if err != nil {
					return answers, err
				}
				if answers[start+k] == errUnknown {
					pending--
				}
				answers[start+k] = e
			}
		}
	}
	return answers, nil
}

// errUnknown marks a request whose answer never came.
const errUnknown = syscall.Errno(^uintptr(0) >> 1)

// query sends one request, a get (with name) or a dump (without), and
// calls each with the payload of every answer (after the netlink header;
// the buffer is reused after each returns) until the kernel's last
// message: NLMSG_DONE of a dump, or the ack of a get.
func (c *conn) query(name string, each func(data []byte) error) error {
	seq := c.seq
	c.seq++
	flags := uint16(unix.NLM_F_REQUEST | unix.NLM_F_ACK)
	if name == "" {
		flags = unix.NLM_F_REQUEST | unix.NLM_F_DUMP
	}
	req := appendRequest(nil, msgGet, flags, seq, name)
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("nfacct: netlink send: %w", err)
	}
	for {
		msgs, err := c.recv()
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue // a late answer to an earlier request
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				e, err := ackErrno(m.data)
				if err != nil {
					return err
				}
				if e != 0 {
					return e
				}
				return nil
			default:
				if err := each(m.data); err != nil {
					return err
				}
			}
		}
	}
}
