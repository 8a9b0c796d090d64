package ipvs

import (
	"net/netip"
	"strings"
)

// IPv4 and IPv6 share one IPVS table and one dummy interface, but each
// Proxier owns one family: these views show a Proxier only its family's
// virtual servers and addresses, and name its ipsets (a set holds one
// family). The proxier code stays family-blind; a full Sync of one family
// never deletes the other's virtual servers or VIPs.

// SetName returns the name of the ipset base (SetVIPs, ...) for family:
// the IPv4 sets keep their names, the IPv6 ones are STEELYARD-IPVS6-*.
func SetName(family int, base string) string {
	if family != 6 {
		return base
	}
	return strings.Replace(base, "STEELYARD-IPVS-", "STEELYARD-IPVS6-", 1)
}

func sameFamily(a netip.Addr, family int) bool { return a.Unmap().Is4() == (family != 6) }

// familyIPVS lists only the virtual servers of one family.
type familyIPVS struct {
	Interface
	family int
}

func (f familyIPVS) VirtualServers() ([]VirtualServer, error) {
	vss, err := f.Interface.VirtualServers()
	if err != nil {
		return nil, err
	}
	out := vss[:0:0]
	for _, vs := range vss {
		if sameFamily(vs.Address, f.family) {
			out = append(out, vs)
		}
	}
	return out, nil
}

// familyLinks lists only the addresses of one family.
type familyLinks struct {
	Links
	family int
}

func (f familyLinks) Addresses(name string) ([]netip.Addr, error) {
	addrs, err := f.Links.Addresses(name)
	if err != nil {
		return nil, err
	}
	out := addrs[:0:0]
	for _, a := range addrs {
		if sameFamily(a, f.family) {
			out = append(out, a)
		}
	}
	return out, nil
}

// familySets names the sets of one family: the proxier uses the IPv4 names
// (SetVIPs, ...) throughout, and this view renames them for IPv6.
type familySets struct {
	Sets
	family int
}

func (f familySets) Restore(text string) error {
	if f.family != 6 {
		return f.Sets.Restore(text)
	}
	// "create|add|del|destroy NAME ...": rename the second word.
	var b strings.Builder
	b.Grow(len(text) + strings.Count(text, "\n"))
	for line := range strings.Lines(text) {
		cmd, rest, ok := strings.Cut(line, " ")
		if !ok {
			b.WriteString(line)
			continue
		}
		name, tail, _ := strings.Cut(rest, " ")
		b.WriteString(cmd + " " + SetName(6, strings.TrimSuffix(name, "\n")))
		if tail != "" {
			b.WriteString(" " + tail)
		} else if strings.HasSuffix(name, "\n") {
			b.WriteString("\n")
		}
	}
	return f.Sets.Restore(b.String())
}

func (f familySets) Entries(name string) ([]SetEntry, error) {
	return f.Sets.Entries(SetName(f.family, name))
}

func (f familySets) List(names []string) (map[string][]SetEntry, error) {
	real := make([]string, len(names))
	for i, n := range names {
		real[i] = SetName(f.family, n)
	}
	m, err := f.Sets.List(real)
	if err != nil || f.family != 6 {
		return m, err
	}
	out := make(map[string][]SetEntry, len(m))
	for i, n := range names {
		if es, ok := m[real[i]]; ok {
			out[n] = es
		}
	}
	return out, nil
}

func (f familySets) Destroy(name string) error {
	return f.Sets.Destroy(SetName(f.family, name))
}
