package ebpf

import (
	"encoding"
	"errors"
	"fmt"
	"sort"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
)

// bpfMap is the part of a BPF map the tables use: the kernel's
// (kernelMap) or a map in memory (MemMap) that keeps the encoded bytes
// the way the kernel does, for unit tests and the CLI's wiring tests.
type bpfMap interface {
	Put(key, value encoding.BinaryMarshaler) error
	Delete(key encoding.BinaryMarshaler) error
	// Lookup decodes key's value into v; false (and no error) when the
	// map has no such key.
	Lookup(key encoding.BinaryMarshaler, v encoding.BinaryUnmarshaler) (bool, error)
	// Each decodes every entry into k and v and calls fn.
	Each(k, v encoding.BinaryUnmarshaler, fn func()) error
	Close() error
}

// kernelMap is a pinned or loaded BPF map.
type kernelMap struct{ m *ebpf.Map }

func (k kernelMap) Put(key, value encoding.BinaryMarshaler) error {
	return retryNoMem(func() error { return k.m.Put(key, value) })
}

// noMemRetries bounds retryNoMem: at most about 0.1 s of sleeps per update.
const noMemRetries = 10

// retryNoMem runs update again, a bounded number of times after a short
// sleep, while the kernel answers ENOMEM. Why: the maps created with
// BPF_F_NO_PREALLOC (slots, counts) take each new element from the BPF
// memory allocator's per-CPU caches, which the kernel refills
// asynchronously (irq_work) since 6.1, so a burst of updates from user
// space (a first sync writes 100,000 slots at 10,000 Services) can find
// a cache empty and get ENOMEM while memory is free. Seen here on 6.18
// (TestKernelChangeToMap, counters, under load); reported on 6.12 and
// 6.18 elsewhere (amazon-linux-2023#1129). A sleep lets the refill run; a
// full map (E2BIG) or any other error returns at once.
func retryNoMem(update func() error) error {
	err := update()
	for i := 0; i < noMemRetries && errors.Is(err, syscall.ENOMEM); i++ {
		time.Sleep(time.Millisecond << min(i, 4))
		err = update()
	}
	return err
}

func (k kernelMap) Delete(key encoding.BinaryMarshaler) error {
	if err := k.m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

func (k kernelMap) Lookup(key encoding.BinaryMarshaler, v encoding.BinaryUnmarshaler) (bool, error) {
	if err := k.m.Lookup(key, v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func (k kernelMap) Each(key, value encoding.BinaryUnmarshaler, fn func()) error {
	it := k.m.Iterate()
	for it.Next(key, value) {
		fn()
	}
	return it.Err()
}

func (k kernelMap) Close() error { return k.m.Close() }

// MemMap is a BPF hash map in memory: entries of fixed-size encoded keys
// and values, a maximum number of entries as the kernel enforces.
type MemMap struct {
	KeySize, ValueSize, MaxEntries int
	entries                        map[string][]byte
}

// NewMemMap returns an empty MemMap.
func NewMemMap(keySize, valueSize, maxEntries int) *MemMap {
	return &MemMap{KeySize: keySize, ValueSize: valueSize, MaxEntries: maxEntries, entries: map[string][]byte{}}
}

// Put implements bpfMap: E2BIG when full, as the kernel.
func (m *MemMap) Put(key, value encoding.BinaryMarshaler) error {
	k, err := key.MarshalBinary()
	if err != nil {
		return err
	}
	v, err := value.MarshalBinary()
	if err != nil {
		return err
	}
	if len(k) != m.KeySize || len(v) != m.ValueSize {
		return fmt.Errorf("memmap: key %d/value %d bytes, want %d/%d", len(k), len(v), m.KeySize, m.ValueSize)
	}
	if _, ok := m.entries[string(k)]; !ok && len(m.entries) >= m.MaxEntries {
		return errors.New("memmap: map full (E2BIG)")
	}
	m.entries[string(k)] = v
	return nil
}

// Delete implements bpfMap.
func (m *MemMap) Delete(key encoding.BinaryMarshaler) error {
	k, err := key.MarshalBinary()
	if err != nil {
		return err
	}
	delete(m.entries, string(k))
	return nil
}

// Lookup implements bpfMap.
func (m *MemMap) Lookup(key encoding.BinaryMarshaler, v encoding.BinaryUnmarshaler) (bool, error) {
	k, err := key.MarshalBinary()
	if err != nil {
		return false, err
	}
	b, ok := m.entries[string(k)]
	if !ok {
		return false, nil
	}
	return true, v.UnmarshalBinary(b)
}

// Each implements bpfMap, in key order.
func (m *MemMap) Each(key, value encoding.BinaryUnmarshaler, fn func()) error {
	keys := make([]string, 0, len(m.entries))
	for k := range m.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := key.UnmarshalBinary([]byte(k)); err != nil {
			return err
		}
		if err := value.UnmarshalBinary(m.entries[k]); err != nil {
			return err
		}
		fn()
	}
	return nil
}

// Close implements bpfMap.
func (m *MemMap) Close() error { return nil }

// Len returns the number of entries.
func (m *MemMap) Len() int { return len(m.entries) }
