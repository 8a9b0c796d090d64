//go:build e2e

package nfacct

// Kernel tests (root; make e2e). Every step runs on a thread moved into a
// network namespace of its own (unshare): nobody else sees it, nothing
// mounts it, and it goes when the thread exits with its goroutine, also
// on failure. nfacct objects belong to their namespace, so the machine's
// own are never touched.

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inNetns runs f on a thread in a new, empty network namespace and returns
// its error. The thread stays locked, so the runtime ends it (and the
// namespace with it) when the goroutine returns.
func inNetns(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("unshare: %w", err)
			return
		}
		done <- f()
	}()
	return <-done
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	return out
}

// byName lists the namespace's objects.
func byName() (map[string]Counter, error) {
	list, err := Kernel{}.List()
	if err != nil {
		return nil, err
	}
	m := make(map[string]Counter, len(list))
	for _, c := range list {
		m[c.Name] = c
	}
	return m, nil
}

// Thousands of objects created over one socket, read back in one dump,
// created again without error (their counts kept), deleted; and none of
// them in another namespace.
func TestKernelBatch(t *testing.T) {
	const n = 5000
	want := names("sy-ep-test-", n)
	err := inNetns(func() error {
		start := time.Now()
		if err := (Kernel{}).Ensure(want...); err != nil {
			return err
		}
		t.Logf("%d objects created in %v", n, time.Since(start))
		got, err := byName()
		if err != nil {
			return err
		}
		if len(got) != n {
			return fmt.Errorf("listed %d objects, want %d", len(got), n)
		}
		for _, name := range want {
			if c, ok := got[name]; !ok || c.Packets != 0 {
				return fmt.Errorf("object %s: %+v, listed %v", name, c, ok)
			}
		}
		c, err := Kernel{}.Get(want[n/2])
		if err != nil || c.Name != want[n/2] {
			return fmt.Errorf("get %s: %+v, %v", want[n/2], c, err)
		}
		// Again, with new ones among them: EBUSY for the existing ones
		// is success.
		more := append(want[:10:10], "sy-ep-test-new")
		if err := (Kernel{}).Ensure(more...); err != nil {
			return fmt.Errorf("ensure existing: %w", err)
		}
		// Objects are per namespace: a fresh one has none of them.
		if err := inNetns(func() error {
			other, err := byName()
			if err != nil {
				return err
			}
			if len(other) != 0 {
				return fmt.Errorf("another namespace lists %d objects", len(other))
			}
			return nil
		}); err != nil {
			return err
		}
		start = time.Now()
		if err := (Kernel{}).Delete(append(want, "sy-ep-test-new", "sy-ep-never-made")...); err != nil {
			return err
		}
		t.Logf("%d objects deleted in %v", n+1, time.Since(start))
		got, err = byName()
		if err != nil {
			return err
		}
		if len(got) != 0 {
			return fmt.Errorf("%d objects left after the delete", len(got))
		}
		if _, err := (Kernel{}).Get(want[0]); !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("get of a deleted object: %v, want ErrNotFound", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A batch the kernel refuses in the middle (a name over NFACCT_NAME_MAX,
// which Ensure itself would not send) leaves no object of its own behind,
// and the one that existed before stays.
func TestKernelEnsureAllOrNone(t *testing.T) {
	err := inNetns(func() error {
		if err := (Kernel{}).Ensure("sy-ep-before"); err != nil {
			return err
		}
		batch := names("sy-ep-rollback-", 300)
		batch[150] = strings.Repeat("x", 40)
		batch = append(batch, "sy-ep-before")
		err := ensure(batch)
		if err == nil || !strings.Contains(err.Error(), batch[150]) {
			return fmt.Errorf("a batch with a 40-character name: %v, want its failure", err)
		}
		got, err := byName()
		if err != nil {
			return err
		}
		if _, ok := got["sy-ep-before"]; !ok || len(got) != 1 {
			return fmt.Errorf("after the failed batch %d objects (%v), want only sy-ep-before", len(got), ok)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An object that a rule names cannot be deleted (EBUSY) and stays, the
// others in the same call go: why the iptables mode deletes objects only
// after the restore that removed their rules.
func TestKernelDeleteInUse(t *testing.T) {
	for _, ipt := range []string{"iptables-legacy", "iptables-nft"} {
		t.Run(ipt, func(t *testing.T) {
			err := inNetns(func() error {
				if err := (Kernel{}).Ensure("sy-ep-used", "sy-ep-free"); err != nil {
					return err
				}
				// exec from this locked thread: the child is in its namespace.
				if out, err := exec.Command(ipt, "-w", "-A", "OUTPUT", "-m", "nfacct", "--nfacct-name", "sy-ep-used").CombinedOutput(); err != nil {
					return fmt.Errorf("%s: %w: %s", ipt, err, out)
				}
				err := (Kernel{}).Delete("sy-ep-used", "sy-ep-free")
				if err == nil || !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "sy-ep-used") {
					return fmt.Errorf("delete of an object in use: %v, want EBUSY naming it", err)
				}
				got, err := byName()
				if err != nil {
					return err
				}
				if _, ok := got["sy-ep-used"]; !ok || len(got) != 1 {
					return fmt.Errorf("after the delete: %d objects, sy-ep-used kept %v; want it alone", len(got), ok)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// BenchmarkKernelEnsure times creating n objects in a fresh namespace,
// all over one socket (Ensure(names...)) and one socket per object (the
// release before batching), then deleting them in reverse order of
// creation (each delete walks the kernel's list to its object):
//
//	go test -tags e2e -run X -bench KernelEnsure -benchtime 1x ./dataplane/nfacct/
//
// Both grow as n^2: the kernel walks its list of a namespace's objects
// for every create (the duplicate check), delete and -m nfacct rule check.
func BenchmarkKernelEnsure(b *testing.B) {
	for _, n := range []int{2500, 5000, 10000, 20000} {
		for _, batched := range []bool{true, false} {
			name := fmt.Sprintf("n=%d/one-socket-each", n)
			if batched {
				name = fmt.Sprintf("n=%d/one-socket", n)
			}
			b.Run(name, func(b *testing.B) {
				for range b.N {
					err := inNetns(func() error {
						ns := names("sy-ep-", n)
						start := time.Now()
						if batched {
							if err := (Kernel{}).Ensure(ns...); err != nil {
								return err
							}
						} else {
							for _, x := range ns {
								if err := (Kernel{}).Ensure(x); err != nil {
									return err
								}
							}
						}
						b.ReportMetric(time.Since(start).Seconds(), "create-s")
						start = time.Now()
						if l, err := (Kernel{}).List(); err != nil || len(l) != n {
							return fmt.Errorf("listed %d, %v", len(l), err)
						}
						b.ReportMetric(time.Since(start).Seconds(), "list-s")
						slices.Reverse(ns)
						start = time.Now()
						if err := (Kernel{}).Delete(ns...); err != nil {
							return err
						}
						b.ReportMetric(time.Since(start).Seconds(), "delete-reverse-s")
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
