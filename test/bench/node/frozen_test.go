package main

import (
	"slices"
	"testing"
)

// -phases takes the four known runs in any order, once each.
func TestParsePhases(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		ok   bool
	}{
		{"steady,churn", []string{"steady", "churn"}, true},
		{"steady,churn,bystander,frozen", []string{"steady", "churn", "bystander", "frozen"}, true},
		{"frozen, churn", []string{"frozen", "churn"}, true},
		{"steady,frozen,steady", nil, false},
		{"steady,freeze", nil, false},
		{"", nil, false},
	} {
		got, err := parsePhases(tc.in)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("parsePhases(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// The frozen run scales the backends as churn does; only steady does not
// scale anything.
func TestChurns(t *testing.T) {
	for phase, want := range map[string]bool{"steady": false, "churn": true, "bystander": true, "frozen": true} {
		if got := churns(phase); got != want {
			t.Errorf("churns(%q) = %v, want %v", phase, got, want)
		}
	}
}

// Only the state letter after the last parenthesis counts: a comm may
// hold ") T".
func TestStopped(t *testing.T) {
	for stat, want := range map[string]bool{
		"4242 (steelyard) T 4200 4242 4242 0 -1":   true,
		"4242 (steelyard) S 4200 4242 4242 0 -1":   false,
		"4242 (odd) T name) R 4200 4242 4242 0 -1": false,
		"4242 (steelyard)":                         false,
		"":                                         false,
	} {
		if got := stopped(stat); got != want {
			t.Errorf("stopped(%q) = %v, want %v", stat, got, want)
		}
	}
}
