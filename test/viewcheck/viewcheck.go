// Package viewcheck reads explain's views the way the end-to-end suites
// compare them: the entry of one VIP, its shares by backend IP, and share
// maps compared within a tolerance.
package viewcheck

import (
	"math"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Find returns the view of vip:port, or nil.
func Find(views []dataplane.ServiceView, vip string, port uint16) *dataplane.ServiceView {
	for i := range views {
		if views[i].VIP == vip && views[i].Port == port {
			return &views[i]
		}
	}
	return nil
}

// Shares maps backend IP to share (percent); empty for a nil view.
func Shares(v *dataplane.ServiceView) map[string]float64 {
	out := map[string]float64{}
	if v == nil {
		return out
	}
	for _, b := range v.Backends {
		out[b.IP] += b.Share
	}
	return out
}

// Same compares two IP->share maps within 0.01 points; a missing IP counts
// as a share of 0.
func Same(a, b map[string]float64) bool {
	for k, v := range a {
		if math.Abs(v-b[k]) > 0.01 {
			return false
		}
	}
	for k, v := range b {
		if math.Abs(v-a[k]) > 0.01 {
			return false
		}
	}
	return true
}
