package main

// The ebpf mode's run: a cgroup v2 sub-cgroup and a bpffs of the
// benchmark's own, and the pinned maps read back with cilium/ebpf (the
// first sync counted from them, each change seen in them).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/steelyard-net/steelyard/test/sandbox"
)

// cgroupUnified is the cgroup v2 hierarchy on this machine's hybrid layout
// (/work/shared/notes: never attach to its root; a sub-cgroup of ours).
const cgroupUnified = "/sys/fs/cgroup/unified"

// ebpfEnv is what one ebpf-mode run needs: the sub-cgroup the socket
// programs attach to (the benchmark process moves in, so sockets it makes
// in the namespaces are balanced, as test/e2e does) and a bpffs for the
// pins. close undoes it all; call it after the agent has stopped.
type ebpfEnv struct {
	cgroup     string // under cgroupUnified
	cgroupPath string // as the agent reaches it from `ip netns exec` (fresh /sys)
	mount      string // the bpffs
	pinDir     string
	origCgroup string
}

func setupEBPF() (*ebpfEnv, error) {
	e := &ebpfEnv{cgroup: filepath.Join(cgroupUnified, fmt.Sprintf("steelyard-bench-%d", os.Getpid()))}
	if err := os.Mkdir(e.cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("ebpf: sub-cgroup: %w", err)
	}
	orig, err := sandbox.OwnCgroup()
	if err != nil {
		os.Remove(e.cgroup)
		return nil, err
	}
	e.origCgroup = orig
	// `ip netns exec` mounts a fresh /sys without the cgroup mounts; the
	// agent reaches the sub-cgroup through our root.
	e.cgroupPath = fmt.Sprintf("/proc/%d/root%s", os.Getpid(), e.cgroup)
	parent, err := os.MkdirTemp("", "k8s-bench-bpffs-")
	if err != nil {
		os.Remove(e.cgroup)
		return nil, err
	}
	e.mount = parent
	if err := syscall.Mount("bpf", e.mount, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(parent)
		os.Remove(e.cgroup)
		return nil, fmt.Errorf("ebpf: mount a bpffs: %w", err)
	}
	e.pinDir = filepath.Join(e.mount, "steelyard")
	if err := os.WriteFile(filepath.Join(e.cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		e.close()
		return nil, fmt.Errorf("ebpf: move the benchmark into %s: %w", e.cgroup, err)
	}
	return e, nil
}

// close removes the pins (the links with them: the programs detach),
// unmounts the bpffs, moves the benchmark back and removes the cgroup.
func (e *ebpfEnv) close() {
	os.RemoveAll(e.pinDir)
	if err := syscall.Unmount(e.mount, syscall.MNT_DETACH); err != nil {
		logf("ebpf: unmount %s: %v", e.mount, err)
	}
	os.Remove(e.mount)
	_ = os.WriteFile(filepath.Join(cgroupUnified, e.origCgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	var err error
	for range 100 {
		if err = os.Remove(e.cgroup); err == nil || !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		logf("ebpf: remove %s: %v", e.cgroup, err)
	}
}

// The map layouts of dataplane/ebpf (bpf/socklb.c, maps.go): addresses
// as 16 bytes (IPv4 v4-mapped), ports in network order, the rest in host
// order.
const (
	mapServices = "services"
	mapSlots    = "slots"
	protoTCP    = 6
)

// svcKeyBytes is struct svc_key of a TCP VIP.
func svcKeyBytes(vip netip.Addr, port uint16) []byte {
	b := make([]byte, 20)
	a := vip.As16()
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[16:18], port)
	b[18] = protoTCP
	return b
}

// svcValOf reads the table ID and slot count of struct svc_val.
func svcValOf(b []byte) (id, count uint32, ok bool) {
	if len(b) < 8 {
		return 0, 0, false
	}
	return binary.NativeEndian.Uint32(b[0:4]), binary.NativeEndian.Uint32(b[4:8]), true
}

// slotKeyBytes is struct slot_key.
func slotKeyBytes(id, slot uint32) []byte {
	b := make([]byte, 8)
	binary.NativeEndian.PutUint32(b[0:4], id)
	binary.NativeEndian.PutUint32(b[4:8], slot)
	return b
}

// backendOf reads struct backend.
func backendOf(b []byte) (netip.AddrPort, bool) {
	if len(b) < 18 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[:16])).Unmap(), binary.BigEndian.Uint16(b[16:18])), true
}

// ebpfMaps reads the pinned services and slots maps of one run.
type ebpfMaps struct {
	pinDir          string
	services, slots *ebpf.Map
}

// open opens the maps once the agent has pinned them.
func (m *ebpfMaps) open() error {
	if m.services != nil {
		return nil
	}
	s, err := ebpf.LoadPinnedMap(filepath.Join(m.pinDir, mapServices), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	t, err := ebpf.LoadPinnedMap(filepath.Join(m.pinDir, mapSlots), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		s.Close()
		return err
	}
	m.services, m.slots = s, t
	return nil
}

func (m *ebpfMaps) close() {
	if m.services != nil {
		m.services.Close()
		m.slots.Close()
	}
}

// scan counts the backends in the pod range on endpointPort of every
// table the services map points at, and whether want is one of them (the
// kernelScanner of the ebpf mode; ns is not needed: maps are not per
// namespace).
func (m *ebpfMaps) scan(ctx context.Context, _ string, want string) (int, bool, error) {
	if err := m.open(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, false, nil // not pinned yet
		}
		return 0, false, err
	}
	live := map[uint32]bool{}
	var k, v []byte
	it := m.services.Iterate()
	for it.Next(&k, &v) {
		if id, _, ok := svcValOf(v); ok {
			live[id] = true
		}
	}
	if err := it.Err(); err != nil {
		return 0, false, fmt.Errorf("services map: %w", err)
	}
	wantAddr, _ := netip.ParseAddr(want)
	return countBackends(m.slots.Iterate(), live, wantAddr)
}

// slotIter is what countBackends needs of a map iterator.
type slotIter interface {
	Next(key, value any) bool
	Err() error
}

// countBackends counts the distinct pod-range backends on endpointPort of
// the live tables, and whether want is one of them.
func countBackends(it slotIter, live map[uint32]bool, want netip.Addr) (int, bool, error) {
	seen := map[[2]uint64]bool{}
	found := false
	var k, v []byte
	for it.Next(&k, &v) {
		if len(k) < 4 {
			continue
		}
		id := binary.NativeEndian.Uint32(k[0:4])
		be, ok := backendOf(v)
		if !ok || !live[id] || be.Port() != endpointPort || !podRange.Contains(be.Addr()) {
			continue
		}
		a := be.Addr().As4()
		seen[[2]uint64{uint64(id), uint64(binary.BigEndian.Uint32(a[:]))}] = true
		if be.Addr() == want {
			found = true
		}
	}
	return len(seen), found, it.Err()
}

var podRange = netip.MustParsePrefix("198.19.0.0/16")

// ebpfPollPeriod is how often waitMap reads the changed port's entries.
const ebpfPollPeriod = time.Millisecond

// waitMap polls the services entry of vip:80/TCP, and its table's slots
// whenever the entry changes (a changed port gets a new table under a new
// ID, switched in one update) and every 50th poll anyway, until a slot
// holds want:endpointPort; it returns the time of the poll that saw it.
func (m *ebpfMaps) waitMap(ctx context.Context, vip netip.Addr, want string) (time.Time, error) {
	addr, err := netip.ParseAddr(want)
	if err != nil {
		return time.Time{}, err
	}
	tick := time.NewTicker(ebpfPollPeriod)
	defer tick.Stop()
	key := svcKeyBytes(vip, 80)
	var lastID, lastCount uint32
	for n := 0; ; n++ {
		if err := m.open(); err != nil {
			return time.Time{}, err
		}
		var v []byte
		if err := m.services.Lookup(key, &v); err == nil {
			id, count, _ := svcValOf(v)
			if id != lastID || count != lastCount || n%50 == 0 {
				lastID, lastCount = id, count
				for s := range min(count, 1<<16) {
					var b []byte
					if m.slots.Lookup(slotKeyBytes(id, s), &b) != nil {
						continue
					}
					if be, ok := backendOf(b); ok && be.Addr() == addr && be.Port() == endpointPort {
						return time.Now(), nil
					}
				}
			}
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return time.Time{}, fmt.Errorf("services map: %w", err)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-tick.C:
		}
	}
}

// mapsMemlock sums the kernel's memory of every map pinned in pinDir
// (fdinfo's memlock, through cilium/ebpf's map info).
func mapsMemlock(pinDir string) (total uint64, per map[string]uint64, err error) {
	ents, err := os.ReadDir(pinDir)
	if err != nil {
		return 0, nil, err
	}
	per = map[string]uint64{}
	for _, e := range ents {
		if e.IsDir() {
			continue // the links
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			return 0, nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		b, ok := info.Memlock()
		if !ok {
			return 0, nil, fmt.Errorf("%s: the kernel gives no memlock", e.Name())
		}
		per[e.Name()] = b
		total += b
	}
	return total, per, nil
}
