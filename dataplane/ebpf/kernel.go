package ebpf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where the maps and links are pinned on a node.
const DefaultPinDir = "/sys/fs/bpf/steelyard"

// linksDir holds one pinned bpf_link per program, under the pin dir.
const linksDir = "links"

// The pinned maps, by the names of bpf/socklb.c. The first is the one
// whose pin says the mode ran here; the optional ones may be missing (pins
// of an earlier version).
var mapNames = []string{socklbMapServices, socklbMapSlots, socklbMapRevnat, socklbMapCounts, socklbMapNames,
	socklbMapMembers, socklbMapAffinity}

var optionalMaps = map[string]bool{socklbMapCounts: true, socklbMapNames: true, socklbMapMembers: true, socklbMapAffinity: true}

// hooks are the programs and the cgroup hooks they attach to.
var hooks = []struct {
	prog   string
	attach ebpf.AttachType
}{
	{socklbProgSyConnect4, ebpf.AttachCGroupInet4Connect},
	{socklbProgSyConnect6, ebpf.AttachCGroupInet6Connect},
	{socklbProgSySendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
	{socklbProgSySendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	{socklbProgSyRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
	{socklbProgSyRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
	{socklbProgSyGetpeername4, ebpf.AttachCgroupInet4GetPeername},
	{socklbProgSyGetpeername6, ebpf.AttachCgroupInet6GetPeername},
}

// CheckCgroup returns an error unless path is a directory of a cgroup v2
// hierarchy. The agent attaches only to the cgroup it is given
// (--cgroup-path): it never guesses one.
func CheckCgroup(path string) error {
	if path == "" {
		return errors.New("--mode ebpf needs --cgroup-path: the cgroup v2 directory whose processes' sockets are balanced " +
			"(on a node the cgroup2 mount that holds the pods and the host's processes, /sys/fs/cgroup or, on a hybrid layout, /sys/fs/cgroup/unified)")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("--cgroup-path %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("--cgroup-path %s: not a cgroup v2 directory", path)
	}
	return nil
}

// maps are the programs' maps, opened from their pins.
type maps struct {
	services, slots bpfMap
	// revnat is written by the programs only; held so it stays pinned.
	revnat *ebpf.Map
	// counts and names: --count-connections (counts.go); nil when the
	// pins predate them.
	counts counterMap
	names  bpfMap
	// members: the backends of ClientIP affinity ports; affinity is
	// written by the programs only (held so it stays pinned).
	members  bpfMap
	affinity *ebpf.Map
	// ids are the slot table IDs in use, as the last full sync of the
	// tables found them plus what partial syncs wrote since (table.go);
	// nil until a full sync read the maps.
	ids *tableIDs
}

func (m *maps) Close() {
	for _, x := range []bpfMap{m.services, m.slots, m.names, m.members} {
		if x != nil {
			x.Close()
		}
	}
	if m.counts != nil {
		m.counts.Close()
	}
	for _, x := range []*ebpf.Map{m.revnat, m.affinity} {
		if x != nil {
			x.Close()
		}
	}
}

// openPinned opens the pinned maps of pinDir; ok false (and no error)
// when nothing is pinned there yet.
func openPinned(pinDir string) (m *maps, ok bool, err error) {
	m = &maps{}
	for i, name := range mapNames {
		x, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if errors.Is(err, fs.ErrNotExist) && i == 0 {
			return nil, false, nil
		}
		if errors.Is(err, fs.ErrNotExist) && optionalMaps[name] {
			continue
		}
		if err != nil {
			m.Close()
			return nil, false, fmt.Errorf("pinned map %s: %w", name, err)
		}
		switch name {
		case socklbMapServices:
			m.services = kernelMap{x}
		case socklbMapSlots:
			m.slots = kernelMap{x}
		case socklbMapCounts:
			m.counts = kernelCounters{x}
		case socklbMapNames:
			m.names = kernelMap{x}
		case socklbMapMembers:
			m.members = kernelMap{x}
		case socklbMapAffinity:
			m.affinity = x
		default:
			m.revnat = x
		}
	}
	return m, true, nil
}

// load loads the programs with their maps pinned in pinDir (the pinned
// ones reused, so a restarted agent keeps every table, every socket's
// reverse entry and every count) and attaches each program to the cgroup,
// or moves its pinned link to the new program: the hooks are never off in
// between. counting sets the programs' count_connections constant.
func load(pinDir, cgroup string, counting bool) (*maps, error) {
	if err := os.MkdirAll(filepath.Join(pinDir, linksDir), 0o700); err != nil {
		return nil, err
	}
	spec, err := loadSocklb()
	if err != nil {
		return nil, err
	}
	for _, name := range mapNames {
		spec.Maps[name].Pinning = ebpf.PinByName
	}
	if counting {
		if err := spec.Variables[socklbVarCountConnections].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("count_connections: %w", err)
		}
	}
	var objs socklbObjects
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	err = spec.LoadAndAssign(&objs, opts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Pins of another layout (an earlier version's services
		// values): new maps. The tables are written again at this sync;
		// sockets connected before see their pod as the peer, and
		// affinity and counts start again.
		log.WithError(err).Warn("pinned maps of another layout: unpinned, and made again")
		for _, name := range mapNames {
			if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		err = spec.LoadAndAssign(&objs, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("load the socket programs: %w", err)
	}
	m := &maps{services: kernelMap{objs.Services}, slots: kernelMap{objs.Slots}, revnat: objs.Revnat,
		counts: kernelCounters{objs.Counts}, names: kernelMap{objs.Names},
		members: kernelMap{objs.Members}, affinity: objs.Affinity}
	progs := map[string]*ebpf.Program{
		socklbProgSyConnect4: objs.SyConnect4, socklbProgSyConnect6: objs.SyConnect6,
		socklbProgSySendmsg4: objs.SySendmsg4, socklbProgSySendmsg6: objs.SySendmsg6,
		socklbProgSyRecvmsg4: objs.SyRecvmsg4, socklbProgSyRecvmsg6: objs.SyRecvmsg6,
		socklbProgSyGetpeername4: objs.SyGetpeername4, socklbProgSyGetpeername6: objs.SyGetpeername6,
	}
	// The links hold the programs; our handles can go.
	defer objs.socklbPrograms.Close()
	for _, h := range hooks {
		if err := attach(filepath.Join(pinDir, linksDir, h.prog), cgroup, h.attach, progs[h.prog]); err != nil {
			m.Close()
			return nil, fmt.Errorf("%s: %w", h.prog, err)
		}
	}
	return m, nil
}

// attach makes the link pinned at pin run prog on cgroup.
func attach(pin, cgroup string, at ebpf.AttachType, prog *ebpf.Program) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer l.Close()
		if sameCgroup(l, cgroup) {
			return l.Update(prog)
		}
		// Pinned by a run with another --cgroup-path: let that one go.
		log.WithField("link", pin).Info("the pinned program is attached to another cgroup: moving it to " + cgroup)
		if err := l.Detach(); err != nil {
			return fmt.Errorf("detach the pinned link: %w", err)
		}
		if err := l.Unpin(); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pinned link: %w", err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: at, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to %s: %w", cgroup, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin the link (bpf_link is needed, Linux 5.7+): %w", err)
	}
	return nil
}

// sameCgroup reports whether l is attached to the cgroup at path (a
// cgroup v2 directory's inode number is the cgroup's ID). When it cannot
// tell, it says yes: the link is then updated in place, as before.
func sameCgroup(l link.Link, path string) bool {
	info, err := l.Info()
	if err != nil || info.Cgroup() == nil {
		return true
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return true
	}
	return info.Cgroup().CgroupId == st.Ino
}

// unload detaches every program and unpins every map of pinDir: unpinned
// links and maps go away with their last file descriptor (this process
// holds none after it). A pin dir that does not exist is clean already.
func unload(pinDir string) error {
	var errs []error
	for _, h := range hooks {
		pin := filepath.Join(pinDir, linksDir, h.prog)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", pin, err))
			continue
		}
		// Detach first: a link pinned elsewhere too must still let go
		// of the cgroup.
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", h.prog, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
		l.Close()
	}
	for _, name := range mapNames {
		if err := os.Remove(filepath.Join(pinDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{filepath.Join(pinDir, linksDir), pinDir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
