package nftables

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// fakeLive makes p's Explain read the knftables Fake's table (what a test
// did to it included), as readKernel reads the kernel's. Test code only:
// the Fake holds rules and elements as nft text, so this parses it. Each
// rule is looked up among the rules p renders (the fixed chains, every
// recorded port's chains); one it never renders reads as opaque, as an
// unknown rule does from the kernel.
func fakeLive(p *Proxier) {
	p.readLive = func() (*liveTable, error) {
		fake := fakeOf(p.nft)
		if fake == nil {
			return nil, errors.New("fakeLive: not a knftables Fake")
		}
		return fakeTable(p, fake)
	}
}

func fakeTable(p *Proxier, fake *knftables.Fake) (*liveTable, error) {
	if fake.Table == nil {
		return nil, nil
	}
	known := map[string]rule{}
	var fixed ops
	p.skeleton(&fixed)
	for _, o := range fixed.list {
		if x, ok := o.obj.(*ruleOp); ok {
			known[x.r.text(p.f)] = x.r
		}
	}
	for _, sp := range p.eng.AppliedPorts() {
		for _, rules := range p.renderPort(sp).chains {
			for _, rl := range rules {
				known[rl.text(p.f)] = rl
			}
		}
	}
	t := newLiveTable()
	for name, c := range fake.Table.Chains {
		t.chains[name] = nil
		for _, fr := range c.Rules {
			txt := strings.TrimSpace(fr.Rule)
			rl, ok := known[txt]
			if !ok {
				rl = r(opaque(txt))
			}
			t.chains[name] = append(t.chains[name], rl)
		}
	}
	for name, m := range fake.Table.Maps {
		switch {
		case name == mapServiceIPs || name == mapServiceNodePorts || name == mapNoEndpointServices || name == mapNoEndpointNodePorts:
			for _, e := range m.Elements {
				key, err := parseSvcKey(name, splitKey(e.Key))
				if err != nil {
					return nil, err
				}
				t.shared[name] = append(t.shared[name], sharedElem{elem{m: name, key: key, to: parseVerdict(strings.Join(e.Value, " . "))}, e.Comment})
			}
		case len(name) > 3 && name[2] == '-' && strings.ContainsRune("dnw", rune(name[0])):
			wm, err := fakeWeightMap(name, m.Elements)
			if err != nil {
				return nil, err
			}
			t.weights[name] = wm
		}
	}
	for name, s := range fake.Table.Sets {
		if s.Timeout != nil {
			t.timeouts[name] = int(*s.Timeout / time.Second)
		}
		for _, e := range s.Elements {
			f := splitKey(e.Key)
			switch name {
			case setNodePortIPs:
				a, err := netip.ParseAddr(f[0])
				if err != nil {
					return nil, err
				}
				t.nodeIPs = append(t.nodeIPs, a)
			case setHairpin:
				a, err1 := netip.ParseAddr(f[0])
				port, err2 := strconv.ParseUint(f[2], 10, 16)
				if err := errors.Join(err1, err2); err != nil {
					return nil, err
				}
				t.hairpin[newHairpinKey(a, protoNumbers[f[1]], uint16(port))] = true
			}
		}
	}
	return t, nil
}

// fakeWeightMap reads a weight map's elements: "lo-hi" keys (the draw),
// "address . port" or verdict values.
func fakeWeightMap(name string, es []*knftables.Element) (*weightMap, error) {
	wm := &weightMap{dnat: name[0] != 'w'}
	for _, e := range es {
		k := splitKey(e.Key)
		if len(k) != 1 {
			return nil, fmt.Errorf("map %s: key %q", name, e.Key)
		}
		lo, hi, _ := strings.Cut(k[0], "-")
		l, err1 := strconv.ParseUint(lo, 10, 32)
		h, err2 := strconv.ParseUint(hi, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		x := wmElem{lo: uint32(l), hi: uint32(h)}
		v := splitKey(e.Value)
		if wm.dnat {
			a, err1 := netip.ParseAddr(v[0])
			port, err2 := strconv.ParseUint(v[len(v)-1], 10, 16)
			if err := errors.Join(err1, err2); err != nil {
				return nil, err
			}
			x.dnat = netip.AddrPortFrom(a, uint16(port))
		} else {
			x.to = parseVerdict(strings.Join(v, " . "))
		}
		wm.elems = append(wm.elems, x)
	}
	return wm, nil
}
