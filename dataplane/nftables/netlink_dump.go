package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// The rule dump. google/nftables reads rules chain by chain (GetRules
// needs the chain) and fails on byteorder, so the rules of the table come
// from one dump on this socket: the kernel resolves a named chain through
// its hash but a table-wide dump needs no name at all, and one request
// instead of one per chain (10,000 at 10,000 Services) keeps the
// requests' overhead out. The socket is a plain blocking one with a 64
// KiB buffer: the kernel then fills dump messages of up to 32 KiB, and
// every message restarts the dump's walk from the table's first rule.

// nlAttr is one netlink attribute of a request.
type nlAttr struct {
	typ uint16
	val []byte
}

// nlConn is a blocking netlink socket for nf_tables GET requests: one
// send and one receive per reply message into a reused buffer (the
// kernel then fills dump messages of up to 32 KiB, so big dumps restart
// less often), no acks asked.
type nlConn struct {
	fd  int
	seq uint32
	buf []byte
}

func netlinkDial() (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nftables: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nftables: netlink bind: %w", err)
	}
	return &nlConn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (c *nlConn) Close() error { return unix.Close(c.fd) }

// get sends one request and collects the payloads of its replies, until
// NLMSG_DONE for a dump; an NLMSG_ERROR returns its errno.
func (c *nlConn) get(typ uint16, dump bool, family byte, as []nlAttr) ([][]byte, error) {
	var out [][]byte
	err := c.each(typ, dump, family, as, func(b []byte) error {
		out = append(out, slices.Clone(b))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// each sends one request and calls fn with the payload of each reply
// (after the nfgenmsg header), until NLMSG_DONE for a dump; an
// NLMSG_ERROR returns its errno, and so does fn's error, after the
// replies are drained (the socket stays usable). The payload is the
// receive buffer's: valid only during the call. Decoding in place,
// without a copy of each 32 KiB message, is what the element reads do.
func (c *nlConn) each(typ uint16, dump bool, family byte, as []nlAttr, fn func([]byte) error) error {
	c.seq++
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	req := make([]byte, unix.NLMSG_HDRLEN+4, 256)
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], flags)
	binary.NativeEndian.PutUint32(req[8:], c.seq)
	req[16], req[17] = family, unix.NFNETLINK_V0
	for _, a := range as {
		n := 4 + len(a.val)
		req = binary.NativeEndian.AppendUint16(req, uint16(n))
		req = binary.NativeEndian.AppendUint16(req, a.typ)
		req = append(req, a.val...)
		req = append(req, make([]byte, (4-n%4)%4)...)
	}
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	var ferr error // fn's first error: the rest of the dump is drained
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		if n > len(c.buf) {
			return fmt.Errorf("netlink receive: message of %d bytes truncated", n)
		}
		b := c.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b))
			mt := binary.NativeEndian.Uint16(b[4:])
			mf := binary.NativeEndian.Uint16(b[6:])
			seq := binary.NativeEndian.Uint32(b[8:])
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return errors.New("netlink receive: bad message")
			}
			data := b[unix.NLMSG_HDRLEN:l:l]
			b = b[min((l+3)&^3, len(b)):]
			if seq != c.seq {
				continue // an answer to an earlier request
			}
			switch {
			case mt == unix.NLMSG_ERROR:
				if len(data) < 4 {
					return errors.New("netlink receive: short error")
				}
				if code := int32(binary.NativeEndian.Uint32(data)); code != 0 {
					return syscall.Errno(-code)
				}
				return ferr
			case mt == unix.NLMSG_DONE:
				return ferr
			case len(data) >= 4 && ferr == nil:
				ferr = fn(data[4:])
			}
			if mf&unix.NLM_F_MULTI == 0 {
				return ferr
			}
		}
	}
}
