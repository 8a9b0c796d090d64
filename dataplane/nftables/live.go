package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// liveNames are the names of the table's objects, read over netlink, and
// the live elements of the shared maps.
type liveNames struct {
	chains, maps, sets map[string]bool
	elems              map[elemID]elem
	hairpin            map[hairpinKey]bool
}

func (l *liveNames) hasAll(o *portObjects) bool {
	for c := range o.chains {
		if !l.chains[c] {
			return false
		}
	}
	for m := range o.maps {
		if !l.maps[m] {
			return false
		}
	}
	for s := range o.sets {
		if !l.sets[s] {
			return false
		}
	}
	return true
}

func (p *Proxier) listLive(ctx context.Context) (*liveNames, error) {
	l := &liveNames{chains: map[string]bool{}, maps: map[string]bool{}, sets: map[string]bool{}, elems: map[elemID]elem{}, hairpin: map[hairpinKey]bool{}}
	for kind, into := range map[string]map[string]bool{"chains": l.chains, "maps": l.maps, "sets": l.sets} {
		names, err := p.nft.List(ctx, kind)
		if isNotFound(err) {
			return l, nil // no table yet
		}
		if err != nil {
			return nil, fmt.Errorf("nftables: list %s: %w", kind, err)
		}
		for _, n := range names {
			into[n] = true
		}
	}
	for _, m := range []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts} {
		if !l.maps[m] {
			continue
		}
		if p.netlink != nil {
			es, err := p.netlink.elements(m)
			if err != nil {
				return nil, fmt.Errorf("nftables: list map %s: %w", m, err)
			}
			for _, x := range es {
				l.elems[x.id()] = x
			}
			continue
		}
		es, err := p.nft.ListElements(ctx, "map", m)
		if err != nil {
			return nil, fmt.Errorf("nftables: list map %s: %w", m, err)
		}
		for _, e := range es {
			key, err := parseSvcKey(m, splitKey(e.Key))
			if err != nil {
				return nil, fmt.Errorf("nftables: list map %s: %w", m, err)
			}
			x := elem{m: m, key: key, to: parseVerdict(strings.Join(e.Value, " . "))}
			l.elems[x.id()] = x
		}
	}
	if l.sets[setHairpin] {
		if err := p.listHairpin(ctx, l); err != nil {
			return nil, fmt.Errorf("nftables: list set %s: %w", setHairpin, err)
		}
	}
	return l, nil
}

// listHairpin reads the hairpin set's elements into l.
func (p *Proxier) listHairpin(ctx context.Context, l *liveNames) error {
	if p.netlink != nil {
		ks, err := p.netlink.hairpinElements()
		for _, k := range ks {
			l.hairpin[k] = true
		}
		return err
	}
	es, err := p.nft.ListElements(ctx, "set", setHairpin)
	if err != nil {
		return err
	}
	for _, e := range es {
		f := splitKey(e.Key)
		if len(f) != 4 {
			return fmt.Errorf("element %q", e.Key)
		}
		a, err1 := netip.ParseAddr(f[0])
		port, err2 := strconv.ParseUint(f[2], 10, 16)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("element %q", e.Key)
		}
		proto, ok := protoNumbers[f[1]]
		if !ok {
			return fmt.Errorf("element %q", e.Key)
		}
		l.hairpin[newHairpinKey(a, proto, uint16(port))] = true
	}
	return nil
}

// splitKey returns the fields of a concatenated key however it was listed.
func splitKey(key []string) []string {
	if len(key) == 1 && strings.Contains(key[0], " . ") {
		key = strings.Split(key[0], " . ")
	}
	out := make([]string, len(key))
	for i, k := range key {
		out[i] = strings.TrimSpace(k)
	}
	return out
}
