// Package nfacct reads and writes the kernel's extended accounting objects
// (nfnetlink_acct): named packet and byte counters that iptables rules
// bump with "-m nfacct --nfacct-name NAME". An object lives in its network
// namespace and keeps counting while the rules that use it are rewritten,
// which a rule's own counter does not (iptables-restore resets it).
package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// MaxNameLen is the longest object name the kernel takes (NFACCT_NAME_MAX
// is 32 with the terminating NUL).
const MaxNameLen = 31

// ErrNotFound is returned for an object the kernel does not have.
var ErrNotFound = errors.New("nfacct object not found")

// Netlink message types of the accounting subsystem
// (include/uapi/linux/netfilter/nfnetlink_acct.h) and its attributes.
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT
	msgNew     = 0 // NFNL_MSG_ACCT_NEW
	msgGet     = 1 // NFNL_MSG_ACCT_GET
	msgDel     = 3 // NFNL_MSG_ACCT_DEL
	attrName   = 1 // NFACCT_NAME, NUL-terminated string
	attrPkts   = 2 // NFACCT_PKTS, big-endian u64
	attrBytes  = 3 // NFACCT_BYTES, big-endian u64
)

// Counter is one accounting object's name and counts.
type Counter struct {
	Name    string
	Packets uint64
	Bytes   uint64
}

// Interface is what the dataplanes need: make an object exist, read it.
type Interface interface {
	// Ensure creates the object name unless it exists (its counts kept).
	Ensure(name string) error
	// Get reads the object name; ErrNotFound when it is missing.
	Get(name string) (Counter, error)
	// Delete removes the object name; a missing one is not an error.
	Delete(name string) error
	// List reads every object of the network namespace in one dump.
	List() ([]Counter, error)
}

// Kernel talks to nfnetlink_acct in the caller's network namespace.
type Kernel struct{}

var _ Interface = Kernel{}

func checkName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("nfacct: name %q: want 1 to %d characters", name, MaxNameLen)
	}
	return nil
}

func request(msg int, flags int, name string) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(subsysAcct<<8|msg, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(attrName, nl.ZeroTerminated(name)))
	return req
}

// Ensure implements Interface. NLM_F_EXCL is left out: the kernel then
// answers an existing object with EBUSY and leaves its counts alone.
func (Kernel) Ensure(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := request(msgNew, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_ACK, name).Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EEXIST) {
		return fmt.Errorf("nfacct: create %s: %w", name, err)
	}
	return nil
}

// Get implements Interface.
func (Kernel) Get(name string) (Counter, error) {
	if err := checkName(name); err != nil {
		return Counter{}, err
	}
	msgs, err := request(msgGet, unix.NLM_F_REQUEST|unix.NLM_F_ACK, name).Execute(unix.NETLINK_NETFILTER, 0)
	if errors.Is(err, syscall.ENOENT) {
		return Counter{}, ErrNotFound
	}
	if err != nil {
		return Counter{}, fmt.Errorf("nfacct: get %s: %w", name, err)
	}
	for _, m := range msgs {
		c, err := Decode(m)
		if err != nil {
			return Counter{}, err
		}
		if c.Name == name {
			return c, nil
		}
	}
	return Counter{}, ErrNotFound
}

// List implements Interface: one NFNL_MSG_ACCT_GET dump (at 100,000
// endpoint counters one request, not 100,000).
func (Kernel) List() ([]Counter, error) {
	req := nl.NewNetlinkRequest(subsysAcct<<8|msgGet, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return nil, fmt.Errorf("nfacct: list: %w", err)
	}
	out := make([]Counter, 0, len(msgs))
	for _, m := range msgs {
		c, err := Decode(m)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// Delete removes the object name; a missing object is not an error, one
// that rules still use is (EBUSY).
func (Kernel) Delete(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := request(msgDel, unix.NLM_F_REQUEST|unix.NLM_F_ACK, name).Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("nfacct: delete %s: %w", name, err)
	}
	return nil
}

// Decode parses one NFNL_MSG_ACCT_NEW message (the kernel's answer to a
// get): the nfgenmsg header, then the attributes.
func Decode(msg []byte) (Counter, error) {
	if len(msg) < nl.SizeofNfgenmsg {
		return Counter{}, fmt.Errorf("nfacct: message of %d bytes", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return Counter{}, fmt.Errorf("nfacct: %w", err)
	}
	var c Counter
	seen := 0
	for _, a := range attrs {
		switch a.Attr.Type {
		case attrName:
			v := a.Value
			for len(v) > 0 && v[len(v)-1] == 0 {
				v = v[:len(v)-1]
			}
			c.Name = string(v)
			seen++
		case attrPkts, attrBytes:
			if len(a.Value) != 8 {
				return Counter{}, fmt.Errorf("nfacct: attribute %d of %d bytes, want 8", a.Attr.Type, len(a.Value))
			}
			if a.Attr.Type == attrPkts {
				c.Packets = binary.BigEndian.Uint64(a.Value)
			} else {
				c.Bytes = binary.BigEndian.Uint64(a.Value)
			}
			seen++
		}
	}
	if seen != 3 {
		return Counter{}, fmt.Errorf("nfacct: message without name, packets and bytes")
	}
	return c, nil
}
