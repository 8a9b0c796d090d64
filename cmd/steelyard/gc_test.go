package main

import "testing"

// TestGCPercent: steelyard's GOGC applies only when the environment sets
// neither GOGC nor GOMEMLIMIT.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		env    map[string]string
		want   int
		wantOK bool
	}{
		{nil, defaultGOGC, true},
		{map[string]string{"GOGC": "200"}, 0, false},
		{map[string]string{"GOGC": "off"}, 0, false},
		{map[string]string{"GOMEMLIMIT": "300MiB"}, 0, false},
	} {
		got, ok := gcPercent(func(k string) string { return tc.env[k] })
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("env %v: got %d, %v; want %d, %v", tc.env, got, ok, tc.want, tc.wantOK)
		}
	}
}
