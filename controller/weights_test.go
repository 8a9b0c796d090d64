package controller

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// Test addresses: pods in 198.19.0.0/16 (RFC 2544 benchmarking range), plus
// documentation IPv6 (2001:db8::/32). See build_test.go for the full plan.

func TestParseWeights(t *testing.T) {
	ip := netip.MustParseAddr
	tests := []struct {
		name    string
		in      string
		want    Weights
		wantErr string // substring of the error; "" means success
	}{
		{
			name: "pod names",
			in:   "pod1=10,pod2=90",
			want: Weights{Pods: map[string]uint32{"pod1": 10, "pod2": 90}, IPs: map[netip.Addr]uint32{}},
		},
		{
			name: "ip and default",
			in:   "198.19.1.2=5,*=3",
			want: Weights{Pods: map[string]uint32{}, IPs: map[netip.Addr]uint32{ip("198.19.1.2"): 5}, Default: 3, HasDefault: true},
		},
		{
			name: "spaces around everything",
			in:   "  web-0.x = 1 ,\t198.19.0.7=  0 , * =65535 ",
			want: Weights{Pods: map[string]uint32{"web-0.x": 1}, IPs: map[netip.Addr]uint32{ip("198.19.0.7"): 0}, Default: 65535, HasDefault: true},
		},
		{
			name: "ipv6 and mapped ipv4",
			in:   "2001:db8::1=2,::ffff:198.19.0.9=4",
			want: Weights{Pods: map[string]uint32{}, IPs: map[netip.Addr]uint32{ip("2001:db8::1"): 2, ip("198.19.0.9"): 4}},
		},
		{
			name: "leading zeros are decimal",
			in:   "a=007",
			want: Weights{Pods: map[string]uint32{"a": 7}, IPs: map[netip.Addr]uint32{}},
		},
		{name: "empty", in: "", wantErr: "empty value"},
		{name: "whitespace only", in: " \t ", wantErr: "empty value"},
		{name: "empty element", in: "a=1,,b=2", wantErr: "element 2 is empty"},
		{name: "trailing comma", in: "a=1,", wantErr: "element 2 is empty"},
		{name: "leading comma", in: ",a=1", wantErr: "element 1 is empty"},
		{name: "missing equals", in: "a=1,pod2", wantErr: `element "pod2" has no "="`},
		{name: "empty key", in: "=5", wantErr: "empty key"},
		{name: "empty weight", in: "pod1=", wantErr: `key "pod1" has an empty weight`},
		{name: "invalid key", in: "Pod_1=3", wantErr: `invalid key "Pod_1"`},
		{name: "ip with zone", in: "fe80::1%eth0=3", wantErr: `invalid key "fe80::1%eth0"`},
		{name: "not a number", in: "pod1=ten", wantErr: `key "pod1": weight "ten" is not a decimal integer`},
		{name: "sign", in: "pod1=+5", wantErr: `weight "+5" is not a decimal integer`},
		{name: "negative", in: "pod1=-1", wantErr: `weight "-1" is not a decimal integer`},
		{name: "hex", in: "pod1=0x10", wantErr: `weight "0x10" is not a decimal integer`},
		{name: "space inside number", in: "pod1=1 0", wantErr: `weight "1 0" is not a decimal integer`},
		{name: "out of range", in: "pod1=65536", wantErr: `key "pod1": weight 65536 is out of range 0..65535`},
		{name: "huge", in: "pod1=99999999999999999999999", wantErr: "out of range"},
		{name: "duplicate pod", in: "pod1=1,pod1=2", wantErr: `duplicate key "pod1"`},
		{name: "duplicate default", in: "*=1, * =2", wantErr: `duplicate key "*"`},
		{name: "same ip spelled twice", in: "2001:db8::1=1,2001:DB8:0::1=2", wantErr: `duplicate key "2001:DB8:0::1"`},
		{name: "mapped duplicate", in: "198.19.0.9=1,::ffff:198.19.0.9=2", wantErr: "duplicate key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseWeights(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseWeights(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseWeights(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseWeights(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestWeightsNamedAndString(t *testing.T) {
	w, err := ParseWeights("*=7, 198.19.0.2=5, web-b=3, 198.19.0.1=4, web-a=2")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := w.String(), "web-a=2,web-b=3,198.19.0.1=4,198.19.0.2=5,*=7"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		pod    string
		ip     netip.Addr
		want   uint32
		wantOK bool
	}{
		{"web-a", ip("198.19.0.1"), 2, true},   // pod name beats IP
		{"other", ip("198.19.0.1"), 4, true},   // IP when the pod is not named
		{"", ip("198.19.0.2"), 5, true},        // no targetRef
		{"other", ip("198.19.0.99"), 0, false}, // "*" is not a name
	} {
		got, ok := w.Named(tc.pod, tc.ip)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("Named(%q, %s) = %d, %v; want %d, %v", tc.pod, tc.ip, got, ok, tc.want, tc.wantOK)
		}
	}
	if !(Weights{}).IsZero() || w.IsZero() {
		t.Errorf("IsZero wrong")
	}
}

func TestParseSplit(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []SplitPart
		wantErr string
	}{
		{name: "two", in: "web-stable=90,web-canary=10", want: []SplitPart{{"web-stable", 90}, {"web-canary", 10}}},
		{name: "one with spaces and zero", in: " web = 0 ", want: []SplitPart{{"web", 0}}},
		{name: "order kept", in: "b=1,a=2", want: []SplitPart{{"b", 1}, {"a", 2}}},
		{name: "empty", in: "", wantErr: "empty value"},
		{name: "blank", in: "   ", wantErr: "empty value"},
		{name: "empty element", in: "a=1,,b=2", wantErr: "element 2 is empty"},
		{name: "trailing comma", in: "a=1,", wantErr: "element 2 is empty"},
		{name: "missing equals", in: "a", wantErr: `element "a" has no "="`},
		{name: "empty key", in: " =1", wantErr: "empty key"},
		{name: "dns-1035 starts with letter", in: "1web=1", wantErr: `invalid key "1web"`},
		{name: "no dots", in: "web.x=1", wantErr: `invalid key "web.x"`},
		{name: "no star", in: "*=1", wantErr: `invalid key "*"`},
		{name: "not a number", in: "a=x", wantErr: `key "a": weight "x" is not a decimal integer`},
		{name: "out of range", in: "a=70000", wantErr: "weight 70000 is out of range"},
		{name: "duplicate", in: "a=1,a=2", wantErr: `duplicate key "a"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSplit(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSplit(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSplit(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseSplit(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			if again, err := ParseSplit(FormatSplit(got)); err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("round trip of %q: %v, %v", tc.in, again, err)
			}
		})
	}
}

func TestParseSliceWeight(t *testing.T) {
	tests := []struct {
		in      string
		want    uint32
		wantErr string
	}{
		{in: "0", want: 0},
		{in: " 42 ", want: 42},
		{in: "65535", want: 65535},
		{in: "", wantErr: "empty value"},
		{in: "  ", wantErr: "empty value"},
		{in: "65536", wantErr: "out of range"},
		{in: "-1", wantErr: "not a decimal integer"},
		{in: "1.5", wantErr: "not a decimal integer"},
		{in: "1,2", wantErr: "not a decimal integer"},
		{in: "a=1", wantErr: "not a decimal integer"},
	}
	for _, tc := range tests {
		got, err := ParseSliceWeight(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSliceWeight(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSliceWeight(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseWeights(f *testing.F) {
	for _, s := range []string{
		"pod1=10,pod2=90", "198.19.1.2=5,*=3", " a = 1 , b=2", "2001:db8::1=1",
		"::ffff:198.19.0.1=1", "a=1,,b=2", "a=", "=1", "a=0x1", "a=65536", "*=1,*=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		w, err := ParseWeights(s)
		if err != nil {
			return
		}
		out := w.String()
		again, err := ParseWeights(out)
		if err != nil {
			t.Fatalf("ParseWeights(%q) accepted, but its formatting %q fails: %v", s, out, err)
		}
		if !reflect.DeepEqual(again, w) {
			t.Fatalf("round trip of %q via %q: got %+v, want %+v", s, out, again, w)
		}
		if again.String() != out {
			t.Fatalf("formatting is not canonical: %q then %q", out, again.String())
		}
	})
}

func FuzzParseSplit(f *testing.F) {
	for _, s := range []string{"web-stable=90,web-canary=10", " a = 0 ", "a=1,a=2", "a=1,", "A=1", "a=99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parts, err := ParseSplit(s)
		if err != nil {
			return
		}
		if len(parts) == 0 {
			t.Fatalf("ParseSplit(%q) accepted no parts", s)
		}
		out := FormatSplit(parts)
		again, err := ParseSplit(out)
		if err != nil {
			t.Fatalf("ParseSplit(%q) accepted, but its formatting %q fails: %v", s, out, err)
		}
		if !reflect.DeepEqual(again, parts) {
			t.Fatalf("round trip of %q via %q: got %+v, want %+v", s, out, again, parts)
		}
	})
}

func FuzzParseSliceWeight(f *testing.F) {
	for _, s := range []string{"0", " 7 ", "65535", "65536", "+1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseSliceWeight(s)
		if err != nil {
			return
		}
		if v > MaxWeight {
			t.Fatalf("ParseSliceWeight(%q) = %d > MaxWeight", s, v)
		}
	})
}
