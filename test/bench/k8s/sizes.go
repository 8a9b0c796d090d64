package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// size is one control plane's load: services Services with endpoints
// endpoints each.
type size struct {
	services, endpoints int
}

func (s size) String() string { return fmt.Sprintf("%dx%d", s.services, s.endpoints) }

// parseSizes reads -services: a comma-separated list of Service counts,
// each optionally with its endpoints per Service after an "x" ("1000x100");
// a count without one gets def endpoints. Endpoints are 1-100 (one
// EndpointSlice per Service holds at most 100).
func parseSizes(s string, def int) ([]size, error) {
	var out []size
	for _, f := range splitList(s) {
		n, m, ok := strings.Cut(f, "x")
		svc, err := strconv.Atoi(n)
		if err != nil || svc < 1 {
			return nil, fmt.Errorf("%q: want a positive number of Services", f)
		}
		eps := def
		if ok {
			if eps, err = strconv.Atoi(m); err != nil {
				return nil, fmt.Errorf("%q: want SERVICESxENDPOINTS", f)
			}
		}
		if eps < 1 || eps > 100 {
			return nil, fmt.Errorf("%q: endpoints per Service must be 1-100", f)
		}
		out = append(out, size{svc, eps})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty")
	}
	return out, nil
}

// minSyncOf reads the minimum sync period a proxy name asks for with a
// "-msp<duration>" suffix ("kube-proxy-nftables-msp250ms"): the base name
// and the period, "" when there is none.
func minSyncOf(name string) (base, period string, err error) {
	i := strings.LastIndex(name, "-msp")
	if i < 0 {
		return name, "", nil
	}
	period = name[i+len("-msp"):]
	d, err := time.ParseDuration(period)
	if err != nil || d <= 0 {
		return "", "", fmt.Errorf("%q: -msp wants a positive duration (-msp250ms)", name)
	}
	return name[:i], period, nil
}
