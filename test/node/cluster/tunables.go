package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// hostTunables are the host-wide sysctls kubelet sets at start
// (pkg/kubelet/cm's setupKernelTunables): not namespaced, so the harness
// records them first and puts them back at teardown.
var hostTunables = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// tunableRecord is the one machine-wide record of the host tunables. Why
// one: clusters run concurrently (parallel conformance runs, several test
// binaries); if each recorded at its own start, a cluster started after
// another's kubelet would record kubelet's values as the originals and put
// those back. So the first owner records, every owner adds its name, and the
// last live owner to leave restores.
type tunableRecord struct {
	// Values are the tunables as they were before any owner's kubelet.
	Values map[string]string `json:"values"`
	// Owners are the names of the clusters' directories (ownerPrefix, PID, a
	// suffix) that still need kubelet's values.
	Owners []string `json:"owners"`
}

// tunableStore is where the record lives and which sysctls it covers;
// tests point it at temporary directories.
type tunableStore struct {
	// Dir holds the record and its lock file (os.TempDir()).
	Dir string
	// ProcSys is /proc/sys.
	ProcSys string
	// Alive reports whether an owner's process still runs.
	Alive func(owner string) bool
}

// hostStore is the store of this machine.
var hostStore = tunableStore{Dir: os.TempDir(), ProcSys: "/proc/sys", Alive: ownerAlive}

// ownerAlive reports whether the process named in owner (ownerPrefix, PID,
// "-", suffix) runs.
func ownerAlive(owner string) bool {
	pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(owner, ownerPrefix), "-", 2)[0])
	return err == nil && pid > 0 && (pid == os.Getpid() || alive(pid))
}

const tunableRecordFile = "steelyard-host-tunables.json"

// locked runs f with the record loaded (nil when there is none) under an
// exclusive flock, and writes back what f returns (removes the file for nil).
func (s tunableStore) locked(f func(*tunableRecord) (*tunableRecord, error)) error {
	lock, err := os.OpenFile(filepath.Join(s.Dir, tunableRecordFile+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	path := filepath.Join(s.Dir, tunableRecordFile)
	var rec *tunableRecord
	if b, err := os.ReadFile(path); err == nil {
		rec = &tunableRecord{}
		if err := json.Unmarshal(b, rec); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	out, err := f(rec)
	if err != nil {
		return err
	}
	if out == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// prune drops owners that no longer run. With none left it restores the
// recorded values and returns a nil record.
func (s tunableStore) prune(rec *tunableRecord) (*tunableRecord, []string, error) {
	if rec == nil {
		return nil, nil, nil
	}
	rec.Owners = slices.DeleteFunc(rec.Owners, func(o string) bool { return !s.Alive(o) })
	if len(rec.Owners) > 0 {
		return rec, nil, nil
	}
	restored, err := s.restore(rec.Values)
	if err != nil {
		// Keep the record: the next owner retries.
		return rec, restored, err
	}
	return nil, restored, nil
}

// Acquire adds owner to the record, creating it from the current values
// when no live owner holds one (after restoring what dead owners left).
func (s tunableStore) Acquire(owner string) (restored []string, err error) {
	err = s.locked(func(rec *tunableRecord) (*tunableRecord, error) {
		var perr error
		rec, restored, perr = s.prune(rec)
		if perr != nil {
			return nil, perr
		}
		if rec == nil {
			vals, err := s.read()
			if err != nil {
				return nil, err
			}
			rec = &tunableRecord{Values: vals}
		}
		if !slices.Contains(rec.Owners, owner) {
			rec.Owners = append(rec.Owners, owner)
		}
		return rec, nil
	})
	return restored, err
}

// Release removes owner; when no live owner is left it restores the
// recorded values and returns which ones it changed.
func (s tunableStore) Release(owner string) (restored []string, err error) {
	err = s.locked(func(rec *tunableRecord) (*tunableRecord, error) {
		if rec == nil {
			return nil, nil
		}
		rec.Owners = slices.DeleteFunc(rec.Owners, func(o string) bool { return o == owner })
		var perr error
		rec, restored, perr = s.prune(rec)
		return rec, perr
	})
	return restored, err
}

// Prune restores the record if every owner is gone (a killed test binary).
func (s tunableStore) Prune() (restored []string, err error) {
	err = s.locked(func(rec *tunableRecord) (*tunableRecord, error) {
		var perr error
		rec, restored, perr = s.prune(rec)
		return rec, perr
	})
	return restored, err
}

// read reads hostTunables.
func (s tunableStore) read() (map[string]string, error) {
	vals := map[string]string{}
	for _, k := range hostTunables {
		b, err := os.ReadFile(filepath.Join(s.ProcSys, k))
		if err != nil {
			return nil, err
		}
		vals[k] = strings.TrimSpace(string(b))
	}
	return vals, nil
}

// restore writes back the recorded values that changed, and returns which
// ones it restored.
func (s tunableStore) restore(vals map[string]string) (restored []string, err error) {
	var errs []error
	for _, k := range hostTunables {
		want, ok := vals[k]
		if !ok {
			continue
		}
		p := filepath.Join(s.ProcSys, k)
		b, err := os.ReadFile(p)
		if err == nil && strings.TrimSpace(string(b)) == want {
			continue
		}
		if err := os.WriteFile(p, []byte(want), 0o644); err != nil {
			errs = append(errs, err)
			continue
		}
		restored = append(restored, fmt.Sprintf("%s=%s (was %s)", strings.ReplaceAll(k, "/", "."), want, strings.TrimSpace(string(b))))
	}
	return restored, errors.Join(errs...)
}
