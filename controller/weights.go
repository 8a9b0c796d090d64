package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The annotations steelyard reads. This file only parses them; build.go
// decides what they mean for traffic.
const (
	// AnnotationWeights on a Service names endpoint weights:
	// "pod1=10,pod2=90" or "198.19.1.2=5,*=3". Keys are pod names, endpoint
	// IP addresses, or "*" for every endpoint not named.
	AnnotationWeights = "steelyard.io/weights"
	// AnnotationSliceWeight on an EndpointSlice gives one weight to every
	// endpoint of that slice.
	AnnotationSliceWeight = "steelyard.io/weight"
	// AnnotationCiliumWeight on an EndpointSlice is read like
	// AnnotationSliceWeight, for users coming from Cilium; AnnotationSliceWeight
	// wins when a slice carries both.
	AnnotationCiliumWeight = "service.cilium.io/weight"
	// AnnotationSplit on a Service splits its new connections across other
	// Services of the same namespace: "web-stable=90,web-canary=10".
	AnnotationSplit = "steelyard.io/split"
)

// Weight limits. Weights fit in 16 bits so that a split part times an
// endpoint weight stays an exact integer in a float64.
const (
	// MaxWeight is the largest weight an annotation may carry.
	MaxWeight uint32 = 65535
	// DefaultWeight is the weight of an endpoint that no annotation names.
	DefaultWeight uint32 = 1
)

// defaultKey is the Weights key of endpoints that are not named.
const defaultKey = "*"

// Weights is a parsed AnnotationWeights value.
type Weights struct {
	// Pods maps pod names (EndpointSlice targetRef.name) to weights.
	Pods map[string]uint32
	// IPs maps endpoint addresses to weights. IPv4-mapped IPv6 addresses are
	// stored unmapped, so both spellings name the same endpoint.
	IPs map[netip.Addr]uint32
	// Default is the weight of endpoints named neither by pod nor by IP; it
	// is meaningful only when HasDefault is set (the "*" key).
	Default    uint32
	HasDefault bool
}

// Named returns the weight that w gives by name to the endpoint of pod (may
// be "") at ip: the pod-name key first, then the IP key. The default ("*") is
// not consulted, because slice weights rank between names and the default.
func (w Weights) Named(pod string, ip netip.Addr) (uint32, bool) {
	if pod != "" {
		if v, ok := w.Pods[pod]; ok {
			return v, true
		}
	}
	if v, ok := w.IPs[ip.Unmap()]; ok {
		return v, true
	}
	return 0, false
}

// IsZero reports whether w names nothing, as when the annotation is absent.
func (w Weights) IsZero() bool {
	return len(w.Pods) == 0 && len(w.IPs) == 0 && !w.HasDefault
}

// String formats w in the annotation syntax, canonically: pod names sorted,
// then IPs sorted, then "*". ParseWeights(w.String()) equals w.
func (w Weights) String() string {
	parts := make([]string, 0, len(w.Pods)+len(w.IPs)+1)
	pods := make([]string, 0, len(w.Pods))
	for p := range w.Pods {
		pods = append(pods, p)
	}
	sort.Strings(pods)
	for _, p := range pods {
		parts = append(parts, p+"="+strconv.FormatUint(uint64(w.Pods[p]), 10))
	}
	ips := make([]netip.Addr, 0, len(w.IPs))
	for ip := range w.IPs {
		ips = append(ips, ip)
	}
	sort.Slice(ips, func(i, j int) bool { return ips[i].Less(ips[j]) })
	for _, ip := range ips {
		parts = append(parts, ip.String()+"="+strconv.FormatUint(uint64(w.IPs[ip]), 10))
	}
	if w.HasDefault {
		parts = append(parts, defaultKey+"="+strconv.FormatUint(uint64(w.Default), 10))
	}
	return strings.Join(parts, ",")
}

// ParseWeights parses an AnnotationWeights value: comma-separated key=weight
// elements, where a key is "*", an IP address, or a pod name (a DNS-1123
// subdomain), and a weight is a decimal integer 0..MaxWeight. Spaces around
// keys, weights and commas are allowed. A key that parses as an IP address is
// an IP, even though "198.19.1.2" is also a valid pod name.
func ParseWeights(s string) (Weights, error) {
	w := Weights{Pods: map[string]uint32{}, IPs: map[netip.Addr]uint32{}}
	err := parseList(s, func(key string, v uint32) error {
		if key == defaultKey {
			if w.HasDefault {
				return fmt.Errorf("duplicate key %q", key)
			}
			w.Default, w.HasDefault = v, true
			return nil
		}
		if ip, err := netip.ParseAddr(key); err == nil {
			if ip.Zone() != "" {
				return fmt.Errorf("invalid key %q: an IP address with a zone cannot name an endpoint", key)
			}
			ip = ip.Unmap()
			if _, dup := w.IPs[ip]; dup {
				return fmt.Errorf("duplicate key %q (IP %s named twice)", key, ip)
			}
			w.IPs[ip] = v
			return nil
		}
		if errs := validation.IsDNS1123Subdomain(key); len(errs) > 0 {
			return fmt.Errorf("invalid key %q: want a pod name, an IP address or %q: %s", key, defaultKey, strings.Join(errs, "; "))
		}
		if _, dup := w.Pods[key]; dup {
			return fmt.Errorf("duplicate key %q", key)
		}
		w.Pods[key] = v
		return nil
	})
	if err != nil {
		return Weights{}, err
	}
	return w, nil
}

// SplitPart is one element of an AnnotationSplit value: a Service of the same
// namespace and the part of new connections it receives.
type SplitPart struct {
	Service string
	Weight  uint32
}

// ParseSplit parses an AnnotationSplit value: comma-separated service=weight
// elements (at least one), where a service is a DNS-1035 label and a weight
// a decimal integer 0..MaxWeight. The order of the parts is kept.
func ParseSplit(s string) ([]SplitPart, error) {
	var parts []SplitPart
	seen := map[string]bool{}
	err := parseList(s, func(key string, v uint32) error {
		if errs := validation.IsDNS1035Label(key); len(errs) > 0 {
			return fmt.Errorf("invalid key %q: want a Service name: %s", key, strings.Join(errs, "; "))
		}
		if seen[key] {
			return fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		parts = append(parts, SplitPart{Service: key, Weight: v})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return parts, nil
}

// FormatSplit formats parts in the AnnotationSplit syntax, in their order.
func FormatSplit(parts []SplitPart) string {
	elems := make([]string, len(parts))
	for i, p := range parts {
		elems[i] = p.Service + "=" + strconv.FormatUint(uint64(p.Weight), 10)
	}
	return strings.Join(elems, ",")
}

// ParseSliceWeight parses an AnnotationSliceWeight or AnnotationCiliumWeight
// value: one decimal integer 0..MaxWeight, optionally surrounded by spaces.
func ParseSliceWeight(s string) (uint32, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return 0, errors.New("empty value")
	}
	return parseWeight(v)
}

// parseList splits s into key=value elements and hands each trimmed key and
// parsed weight to add, which checks the key. It enforces the rules shared by
// every list annotation: not empty, no empty element, "=" present, key not
// empty, weight valid.
func parseList(s string, add func(key string, v uint32) error) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty value")
	}
	for i, elem := range strings.Split(s, ",") {
		if strings.TrimSpace(elem) == "" {
			// 1-based, as people count: "a=1,,b=2" has an empty element 2.
			return fmt.Errorf("element %d is empty (stray comma?)", i+1)
		}
		k, v, ok := strings.Cut(elem, "=")
		if !ok {
			return fmt.Errorf("element %q has no \"=\"", strings.TrimSpace(elem))
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "" {
			return fmt.Errorf("element %q has an empty key", strings.TrimSpace(elem))
		}
		if v == "" {
			return fmt.Errorf("key %q has an empty weight", k)
		}
		w, err := parseWeight(v)
		if err != nil {
			return fmt.Errorf("key %q: %w", k, err)
		}
		if err := add(k, w); err != nil {
			return err
		}
	}
	return nil
}

// parseWeight parses a trimmed, non-empty weight. Only ASCII digits are
// accepted: strconv alone would also take "+5" and, with base 0, "0x10".
func parseWeight(v string) (uint32, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("weight %q is not a decimal integer", v)
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > uint64(MaxWeight) {
		// Only a range error is possible here: v is all digits.
		return 0, fmt.Errorf("weight %s is out of range 0..%d", v, MaxWeight)
	}
	return uint32(n), nil
}
