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

// Interface is what the dataplanes need. Ensure and Delete take many
// names and send them over one netlink socket, BatchSize requests to a
// send: the iptables mode names one object per endpoint, 100,000 at
// 10,000 Services.
type Interface interface {
	// Ensure creates the objects that do not exist; existing ones keep
	// their counts. All or none: when one cannot be created, the ones this
	// call created are deleted again and the error names the first
	// failure (so a restore that names them is never attempted with some
	// missing, and a failed call leaves no new object behind).
	Ensure(names ...string) error
	// Delete removes the objects; a missing one is not an error, one that
	// a rule still names is (EBUSY, and it stays). Every name is tried.
	Delete(names ...string) error
	// List reads every object of the network namespace in one dump.
	List() ([]Counter, error)
}

// Kernel talks to nfnetlink_acct in the network namespace of the calling
// thread, one socket per call.
type Kernel struct{}

var _ Interface = Kernel{}

func checkName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("nfacct: name %q: want 1 to %d characters", name, MaxNameLen)
	}
	return nil
}

func checkNames(names []string) error {
	for _, n := range names {
		if err := checkName(n); err != nil {
			return err
		}
	}
	return nil
}

// Ensure implements Interface. NLM_F_EXCL is left out: the kernel then
// answers an existing object with EBUSY and leaves its counts alone, so
// the answers tell the objects this call created from the others.
func (Kernel) Ensure(names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if err := checkNames(names); err != nil {
		return err
	}
	return ensure(names)
}

// ensure is Ensure without the check of the names (a test makes the
// kernel refuse one).
func ensure(names []string) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.close()
	answers, xerr := c.exchange(msgNew, unix.NLM_F_CREATE, names)
	var failed error
	var undo []string
	for i, e := range answers {
		switch e {
		case 0, errUnknown:
			// Created, or perhaps (the exchange broke off): undone if
			// the call fails. An unknown one that existed before and a
			// rule names is not deleted (EBUSY).
			undo = append(undo, names[i])
		case syscall.EBUSY, syscall.EEXIST:
		default:
			if failed == nil {
				failed = fmt.Errorf("nfacct: create %s: %w", names[i], e)
			}
		}
	}
	if xerr == nil && failed == nil {
		return nil
	}
	if failed == nil {
		failed = xerr
	}
	if len(undo) > 0 {
		// A new socket: the exchange may have broken this one.
		if err := (Kernel{}).Delete(undo...); err != nil {
			return fmt.Errorf("%w (and undoing the %d created: %v)", failed, len(undo), err)
		}
	}
	return failed
}

// Delete implements Interface.
func (Kernel) Delete(names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if err := checkNames(names); err != nil {
		return err
	}
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.close()
	answers, xerr := c.exchange(msgDel, 0, names)
	if xerr != nil {
		return xerr
	}
	var first error
	n := 0
	for i, e := range answers {
		if e == 0 || e == syscall.ENOENT {
			continue
		}
		if first == nil {
			first = fmt.Errorf("%s: %w", names[i], e)
		}
		n++
	}
	if first != nil {
		return fmt.Errorf("nfacct: %d of %d objects not deleted, the first %w", n, len(names), first)
	}
	return nil
}

// Get reads the object name; ErrNotFound when it is missing.
func (Kernel) Get(name string) (Counter, error) {
	if err := checkName(name); err != nil {
		return Counter{}, err
	}
	c, err := dial()
	if err != nil {
		return Counter{}, err
	}
	defer c.close()
	var out Counter
	found := false
	err = c.query(name, func(data []byte) error {
		ctr, err := Decode(data)
		if err == nil && ctr.Name == name {
			out, found = ctr, true
		}
		return err
	})
	if errors.Is(err, syscall.ENOENT) {
		return Counter{}, ErrNotFound
	}
	if err != nil {
		return Counter{}, fmt.Errorf("nfacct: get %s: %w", name, err)
	}
	if !found {
		return Counter{}, ErrNotFound
	}
	return out, nil
}

// List implements Interface: one NFNL_MSG_ACCT_GET dump (at 100,000
// endpoint counters one request, not 100,000).
func (Kernel) List() ([]Counter, error) {
	c, err := dial()
	if err != nil {
		return nil, err
	}
	defer c.close()
	var out []Counter
	err = c.query("", func(data []byte) error {
		ctr, err := Decode(data)
		out = append(out, ctr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("nfacct: list: %w", err)
	}
	return out, nil
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
