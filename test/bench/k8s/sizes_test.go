package main

import (
	"reflect"
	"testing"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("1000, 10000,30000,1000x100", 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []size{{1000, 10}, {10000, 10}, {30000, 10}, {1000, 100}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got[3].String() != "1000x100" {
		t.Errorf("String: %q", got[3].String())
	}
	for _, bad := range []string{"", "0", "1000x0", "1000x101", "x10", "1000x", "ten"} {
		if _, err := parseSizes(bad, 10); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestMinSyncOf(t *testing.T) {
	for _, c := range []struct{ in, base, period string }{
		{"kube-proxy-nftables", "kube-proxy-nftables", ""},
		{"kube-proxy-nftables-msp250ms", "kube-proxy-nftables", "250ms"},
		{"steelyard-nftables-msp1s", "steelyard-nftables", "1s"},
	} {
		b, p, err := minSyncOf(c.in)
		if err != nil || b != c.base || p != c.period {
			t.Errorf("%s: %q %q %v", c.in, b, p, err)
		}
	}
	for _, bad := range []string{"kube-proxy-nftables-msp", "kube-proxy-nftables-msp0s", "x-mspfast"} {
		if _, _, err := minSyncOf(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
