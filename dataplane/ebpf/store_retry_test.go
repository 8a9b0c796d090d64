package ebpf

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestRetryNoMem(t *testing.T) {
	cases := []struct {
		name      string
		fails     int
		err       error
		wantCalls int
		wantErr   bool
	}{
		{"ENOMEM twice, then written", 2, syscall.ENOMEM, 3, false},
		{"ENOMEM wrapped as the library does", 1, fmt.Errorf("update: %w", syscall.ENOMEM), 2, false},
		{"ENOMEM every time: bounded", 1000, syscall.ENOMEM, noMemRetries + 1, true},
		{"a full map is not retried", 1000, syscall.E2BIG, 1, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			err := retryNoMem(func() error {
				calls++
				if calls <= c.fails {
					return c.err
				}
				return nil
			})
			if calls != c.wantCalls || (err != nil) != c.wantErr {
				t.Fatalf("calls %d, err %v; want %d calls, error %v", calls, err, c.wantCalls, c.wantErr)
			}
			if c.wantErr && !errors.Is(err, c.err) && !errors.Is(err, errors.Unwrap(c.err)) {
				t.Fatalf("error %v does not carry %v", err, c.err)
			}
		})
	}
}
