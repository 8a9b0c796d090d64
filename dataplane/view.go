package dataplane

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// ServiceView is what a VIP does, as explain prints it: the share of new
// connections each backend receives. Dataplanes build it from the live kernel;
// Expected builds it from a desired State; verify compares the two.
type ServiceView struct {
	// Service is "namespace/name:port", from the rule comments.
	Service  string        `json:"service"`
	VIP      string        `json:"vip"`
	Port     uint16        `json:"port"`
	Protocol Protocol      `json:"protocol"`
	Backends []BackendView `json:"backends"`
	// Problems are defects the reader found in the live rules that shares
	// do not show (a hairpin connection that is not masqueraded, ...).
	Problems []string `json:"problems,omitempty"`
	// Reject is true when new connections are refused (no usable endpoint).
	// A view with no backends and no Reject describes a VIP whose packets the
	// kernel passes on unchanged: a broken or half-removed ruleset.
	Reject bool `json:"reject,omitempty"`
	// RejectShare is the percentage of new connections refused while the
	// others go to Backends (ServicePort.RejectWeight: the invalid
	// backendRefs of a Gateway API route).
	RejectShare float64 `json:"rejectShare,omitempty"`

	// Entry is how connections reach the Service port here: EntryClusterIP,
	// EntryNodePort (VIP is then 0.0.0.0 or ::, standing for every address
	// in NodeAddresses), EntryExternalIP or EntryLoadBalancer. Empty is read
	// as EntryClusterIP (views of dataplanes that do not tell).
	Entry string `json:"entry,omitempty"`
	// Policy is the traffic policy in force for this entry: "Cluster" or
	// "Local" (the internal policy for the clusterIP, else the external one).
	// Shares are those seen by a client from off the cluster.
	Policy string `json:"policy,omitempty"`
	// Drop is true when new connections from off the cluster are dropped
	// (a Local policy with no local endpoint).
	Drop bool `json:"drop,omitempty"`
	// SourceRanges are the only clients a load-balancer entry accepts.
	SourceRanges []string `json:"sourceRanges,omitempty"`
	// AffinitySeconds is the ClientIP session affinity timeout; 0: none.
	AffinitySeconds int `json:"affinitySeconds,omitempty"`
	// NodeAddresses are the node addresses a node port listens on. Shown,
	// not compared by Diff: the desired state does not know them.
	NodeAddresses []string `json:"nodeAddresses,omitempty"`
	// ShareBound, when set, is how far (in points) the live shares may
	// lie from the weights' by construction: the ebpf mode's slot table
	// of n slots where the weights do not divide it exactly (100/n).
	// Diff accepts differences up to it.
	ShareBound float64 `json:"shareBound,omitempty"`
}

// The entry points of a Service port.
const (
	EntryClusterIP    = "clusterIP"
	EntryNodePort     = "nodePort"
	EntryExternalIP   = "externalIP"
	EntryLoadBalancer = "loadBalancer"
)

// The traffic policies.
const (
	PolicyCluster = "Cluster"
	PolicyLocal   = "Local"
)

// AnyAddr returns the VIP string a node-port view carries for a family.
func AnyAddr(family int) string {
	if family == 6 {
		return "::"
	}
	return "0.0.0.0"
}

// BackendView is one backend and its share of new connections in percent.
type BackendView struct {
	IP    string  `json:"ip"`
	Port  uint16  `json:"port"`
	Share float64 `json:"share"`
}

// RoundShare rounds a share in percent to 4 decimals (1e-6 of the
// connections), the precision explain reports: the kernel's 31-bit
// probabilities would otherwise print as 10.000000009.
func RoundShare(percent float64) float64 {
	return math.Round(percent*1e4) / 1e4
}

// ShareTolerance is how far (in percentage points) a live share may differ
// from the desired one and still agree. Both sides are rounded to RoundShare's
// step (1e-4), so two values a hair apart can round one step apart (weights
// 87/39/2: 67.96875%); two steps absorb that, and the kernel's 31-bit
// probabilities are far more precise than that.
const ShareTolerance = 2e-4

// Expected returns the views a correctly programmed kernel shows for s: one
// per entry point of each Service port (clusterIP, node port, each external
// and load-balancer IP), with the shares an off-cluster client sees.
func Expected(s State) []ServiceView {
	views := make([]ServiceView, 0, len(s.Services))
	for i := range s.Services {
		sp := &s.Services[i]
		// A Service port with no usable endpoint at all is refused
		// everywhere, whatever its policies.
		none := len(sp.Active()) == 0
		view := func(entry, ip string, port uint16, local bool, bs []Backend) ServiceView {
			v := ServiceView{
				Service:         sp.Name.String(),
				VIP:             ip,
				Port:            port,
				Protocol:        sp.VIP.Protocol,
				Backends:        []BackendView{},
				Entry:           entry,
				Policy:          PolicyCluster,
				AffinitySeconds: sp.AffinitySeconds,
			}
			if local {
				v.Policy = PolicyLocal
			}
			total := SumWeights(bs)
			if r := sp.RejectShare(bs); r > 0 {
				v.RejectShare = RoundShare(100 * r)
				total += sp.RejectWeight
			}
			for _, b := range bs {
				v.Backends = append(v.Backends, BackendView{IP: b.IP.String(), Port: b.Port, Share: RoundShare(100 * b.Weight / total)})
			}
			if len(v.Backends) == 0 {
				v.Reject, v.Drop = none, !none
			}
			if v.Reject {
				// Refused before any policy applies.
				v.Policy = ""
			}
			return v
		}
		views = append(views, view(EntryClusterIP, sp.VIP.IP.String(), sp.VIP.Port, sp.InternalLocal, sp.InternalBackends()))
		ext := sp.ExternalBackends()
		if sp.NodePort != 0 {
			views = append(views, view(EntryNodePort, AnyAddr(sp.Family()), sp.NodePort, sp.ExternalLocal, ext))
		}
		for _, ip := range sp.ExternalIPs {
			views = append(views, view(EntryExternalIP, ip.String(), sp.VIP.Port, sp.ExternalLocal, ext))
		}
		for _, ip := range sp.LoadBalancerIPs {
			v := view(EntryLoadBalancer, ip.String(), sp.VIP.Port, sp.ExternalLocal, ext)
			for _, r := range sp.SourceRanges {
				v.SourceRanges = append(v.SourceRanges, r.String())
			}
			views = append(views, v)
		}
	}
	SortViews(views)
	return views
}

// SortViews orders views by VIP, port and protocol, and backends by address.
func SortViews(views []ServiceView) {
	for _, v := range views {
		sort.Slice(v.Backends, func(i, j int) bool {
			return lessAddr(v.Backends[i].IP, v.Backends[i].Port, v.Backends[j].IP, v.Backends[j].Port)
		})
	}
	sort.Slice(views, func(i, j int) bool {
		a, b := views[i], views[j]
		if a.VIP != b.VIP || a.Port != b.Port {
			return lessAddr(a.VIP, a.Port, b.VIP, b.Port)
		}
		return a.Protocol < b.Protocol
	})
}

func entryOf(v ServiceView) string {
	if v.Entry == "" {
		return EntryClusterIP
	}
	return v.Entry
}

func lessAddr(ipa string, pa uint16, ipb string, pb uint16) bool {
	a, errA := netip.ParseAddr(ipa)
	b, errB := netip.ParseAddr(ipb)
	if errA == nil && errB == nil && a != b {
		return a.Less(b)
	}
	if ipa != ipb {
		return ipa < ipb
	}
	return pa < pb
}

// Key returns "198.18.0.10:80/TCP", the VIP the view describes.
func (v ServiceView) Key() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(netip.MustParseAddr(v.VIP), v.Port), v.Protocol)
}

// Line renders the view the way explain prints it:
//
//	198.18.0.10:80/TCP  198.19.1.2:8080 10.00%  198.19.2.2:8080 90.00%  demo/web:http
func (v ServiceView) Line() string {
	var b strings.Builder
	b.WriteString(v.Key())
	switch {
	case v.Reject:
		b.WriteString("  reject (no endpoints)")
	case v.Drop:
		b.WriteString("  drop (no local endpoints)")
	case len(v.Backends) == 0:
		b.WriteString("  not forwarded")
	}
	for _, be := range v.Backends {
		fmt.Fprintf(&b, "  %s %.2f%%", netip.AddrPortFrom(netip.MustParseAddr(be.IP), be.Port), be.Share)
	}
	if v.RejectShare > 0 {
		fmt.Fprintf(&b, "  reject %.2f%%", v.RejectShare)
	}
	if v.Service != "" {
		b.WriteString("  " + v.Service)
	}
	// The plain case (a clusterIP, Cluster policy, no affinity) keeps the
	// short line; anything else says how the connection got here.
	if v.Entry != "" && (v.Entry != EntryClusterIP || v.Policy == PolicyLocal || v.AffinitySeconds > 0) {
		attrs := []string{v.Entry}
		if len(v.NodeAddresses) > 0 {
			attrs = append(attrs, "on "+strings.Join(v.NodeAddresses, ","))
		}
		if v.Policy != "" {
			attrs = append(attrs, "policy "+v.Policy)
		}
		if len(v.SourceRanges) > 0 {
			attrs = append(attrs, "from "+strings.Join(v.SourceRanges, ","))
		}
		if v.AffinitySeconds > 0 {
			attrs = append(attrs, fmt.Sprintf("affinity ClientIP %ds", v.AffinitySeconds))
		}
		b.WriteString("  [" + strings.Join(attrs, ", ") + "]")
	}
	return b.String()
}

// WriteViews prints views as text lines or, with format "json", as a JSON list.
func WriteViews(w io.Writer, views []ServiceView, format string) error {
	switch format {
	case "json":
		if views == nil {
			views = []ServiceView{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	case "", "text":
		for _, v := range views {
			if _, err := fmt.Fprintln(w, v.Line()); err != nil {
				return err
			}
			for _, p := range v.Problems {
				if _, err := fmt.Fprintln(w, "    ! "+p); err != nil {
					return err
				}
			}
		}
		return nil
	default:
		return fmt.Errorf("unknown output format %q (want text or json)", format)
	}
}

// Diff compares the desired views with the live ones and returns readable
// lines ("- want", "+ live") for every VIP that differs; none means they agree.
func Diff(want, live []ServiceView) []string {
	wantBy := map[string]ServiceView{}
	for _, v := range want {
		wantBy[v.Key()] = v
	}
	liveBy := map[string]ServiceView{}
	for _, v := range live {
		liveBy[v.Key()] = v
	}
	keys := map[string]bool{}
	for k := range wantBy {
		keys[k] = true
	}
	for k := range liveBy {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var out []string
	for _, k := range sorted {
		w, inWant := wantBy[k]
		l, inLive := liveBy[k]
		switch {
		case !inLive:
			out = append(out, "- "+w.Line()+"   (missing from the kernel)")
		case !inWant:
			out = append(out, "+ "+l.Line()+"   (not in the desired state)")
		case !sameView(w, l):
			out = append(out, "- "+w.Line(), "+ "+l.Line())
		}
		if inLive {
			for _, p := range l.Problems {
				out = append(out, "! "+l.Key()+": "+p)
			}
		}
	}
	return out
}

func sameView(a, b ServiceView) bool {
	if !SameName(a.Service, b.Service) || len(a.Backends) != len(b.Backends) || a.Reject != b.Reject || a.Drop != b.Drop {
		return false
	}
	if math.Abs(a.RejectShare-b.RejectShare) > ShareTolerance {
		return false
	}
	if entryOf(a) != entryOf(b) || (a.Policy != "" && b.Policy != "" && a.Policy != b.Policy) {
		return false
	}
	if a.AffinitySeconds != b.AffinitySeconds || !slices.Equal(a.SourceRanges, b.SourceRanges) {
		return false
	}
	tol := max(ShareTolerance, a.ShareBound, b.ShareBound)
	for i := range a.Backends {
		x, y := a.Backends[i], b.Backends[i]
		if x.IP != y.IP || x.Port != y.Port || math.Abs(x.Share-y.Share) > tol {
			return false
		}
	}
	return true
}
