package nftables

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// The ruleset generation: the kernel counts every committed nftables
// transaction of the network namespace (NFT_MSG_GETGEN; nft monitor shows
// it as "# new generation"). A full resync exists to repair what someone
// else changed; when the generation is still the one our own last commit
// produced, nobody committed anything since, so the table is exactly what
// we wrote and the full resync need not list it. Listing the names of a
// 10,000-Service table over netlink costs seconds of kernel time (the
// chain dump restarts from the first chain for every message); one
// GETGEN is a single small message.
//
// Custody: known holds a generation only while every commit since it
// was read is explained by one of our commits, each moving it by exactly
// one; valid says which families' tables are as they last listed and
// wrote them since then. The IPv4 and IPv6 Proxiers of one agent share
// one generation (their commits are each other's, not foreign). Any
// other step (a foreign commit, a failed read, a wrap) drops every
// family, and the next full resync of each lists its table as before.
type generation struct {
	read func() (uint32, error) // nil: no kernel (the fake); never skip

	mu    sync.Mutex
	known uint32
	chain bool         // known explains every commit since it was read
	valid map[int]bool // family -> table as listed and written since
}

func newGeneration() *generation { return &generation{valid: map[int]bool{}} }

// unchanged reports whether family's table is as its Proxier wrote it:
// the kernel's generation is still the one recorded after our last commit
// and the family has been listed since custody began.
func (g *generation) unchanged(family int) bool {
	if g.read == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.chain || !g.valid[family] {
		return false
	}
	now, err := g.read()
	return err == nil && now == g.known
}

// listed records that family's table was listed at generation gen (read
// just before the listing) and is repaired from it by this sync.
func (g *generation) listed(family int, gen uint32, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.dropLocked()
		return
	}
	if !g.chain || gen != g.known {
		// Something not ours committed: no other family is known.
		g.dropLocked()
		g.known, g.chain = gen, true
	}
	g.valid[family] = true
}

// before and after wrap one commit: custody survives only if nothing
// else committed since the last record and ours moved it by one.
func (g *generation) before() (uint32, bool) {
	if g.read == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	gen, err := g.read()
	if err != nil || gen != g.known {
		g.dropLocked()
	}
	return gen, err == nil
}

func (g *generation) after(gen0 uint32, ok0, committed bool) {
	if g.read == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !ok0 || !committed {
		g.dropLocked()
		return
	}
	gen, err := g.read()
	if err != nil || gen != gen0+1 {
		g.dropLocked()
		return
	}
	if g.chain {
		g.known = gen
	}
}

// drop forgets every family (a failed sync, Cleanup).
func (g *generation) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked()
}

func (g *generation) dropLocked() {
	g.chain = false
	clear(g.valid)
}

// readGeneration asks the kernel for the ruleset generation of the current
// network namespace.
func readGeneration() (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("nftables: netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("nftables: netlink bind: %w", err)
	}
	// nlmsghdr (16 bytes) + nfgenmsg (4 bytes: family, version, res_id).
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN))
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1) // seq
	req[16] = unix.AF_UNSPEC
	req[17] = unix.NFNETLINK_V0
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("nftables: getgen: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("nftables: getgen: %w", err)
	}
	return parseGeneration(buf[:n])
}

// parseGeneration reads NFTA_GEN_ID from a NFT_MSG_NEWGEN reply.
func parseGeneration(b []byte) (uint32, error) {
	if len(b) < unix.NLMSG_HDRLEN+4 {
		return 0, fmt.Errorf("nftables: getgen: short reply (%d bytes)", len(b))
	}
	typ := binary.NativeEndian.Uint16(b[4:])
	if typ == unix.NLMSG_ERROR {
		if len(b) >= unix.NLMSG_HDRLEN+4 {
			if e := int32(binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN:])); e != 0 {
				return 0, fmt.Errorf("nftables: getgen: %w", unix.Errno(-e))
			}
		}
		return 0, fmt.Errorf("nftables: getgen: error reply")
	}
	if typ != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN {
		return 0, fmt.Errorf("nftables: getgen: reply of type %#x", typ)
	}
	end := int(binary.NativeEndian.Uint32(b[0:]))
	if end > len(b) {
		end = len(b)
	}
	// Attributes after the nfgenmsg: 2-byte length, 2-byte type, then
	// the value (network byte order), padded to 4.
	for at := unix.NLMSG_HDRLEN + 4; at+4 <= end; {
		l := int(binary.NativeEndian.Uint16(b[at:]))
		t := binary.NativeEndian.Uint16(b[at+2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || at+l > end {
			break
		}
		if t == unix.NFTA_GEN_ID && l >= 8 {
			return binary.BigEndian.Uint32(b[at+4:]), nil
		}
		at += (l + 3) &^ 3
	}
	return 0, fmt.Errorf("nftables: getgen: no generation in the reply")
}
