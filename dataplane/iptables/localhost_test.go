package iptables

import (
	"errors"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
	"github.com/steelyard-net/steelyard/dataplane/nfacct"
)

// fakeAcct keeps nfacct objects as the kernel does; fail makes Ensure fail
// (a kernel without nfnetlink_acct).
type fakeAcct struct {
	objs map[string]nfacct.Counter
	fail error
}

// Ensure creates all the names or, failing, none (as nfacct.Kernel does).
func (f *fakeAcct) Ensure(names ...string) error {
	if f.fail != nil {
		return f.fail
	}
	if f.objs == nil {
		f.objs = map[string]nfacct.Counter{}
	}
	for _, name := range names {
		if _, ok := f.objs[name]; !ok {
			f.objs[name] = nfacct.Counter{Name: name}
		}
	}
	return nil
}

func (f *fakeAcct) Get(name string) (nfacct.Counter, error) {
	c, ok := f.objs[name]
	if !ok {
		return nfacct.Counter{}, nfacct.ErrNotFound
	}
	return c, nil
}

func (f *fakeAcct) List() ([]nfacct.Counter, error) {
	out := make([]nfacct.Counter, 0, len(f.objs))
	for _, c := range f.objs {
		out = append(out, c)
	}
	return out, nil
}

func (f *fakeAcct) Delete(names ...string) error {
	for _, name := range names {
		delete(f.objs, name)
	}
	return nil
}

// localhostSync programs s with parityCfg plus cfg's localhost settings
// into a fake kernel; views must still agree with the desired state.
func localhostSync(t *testing.T, s dataplane.State, on bool, acct nfacct.Interface, family int) (*Fake, *Ruleset) {
	t.Helper()
	cfg := parityCfg
	cfg.LocalhostNodePorts, cfg.NFAcct, cfg.Family = on, acct, family
	f := NewFake()
	if _, err := NewProxier(f, cfg).Sync(s, dataplane.FullSync); err != nil {
		t.Fatalf("sync: %v", err)
	}
	rs := f.Ruleset()
	views, err := Views(rs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := dataplane.Diff(dataplane.Expected(s), views); len(diff) > 0 {
		t.Errorf("verify: expected and traced views differ:\n%s", strings.Join(diff, "\n"))
	}
	return f, rs
}

func localhostState() dataplane.State {
	sp := svcPort("ns", "web", "http", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 10), be("198.19.1.3", 8080, 90))
	sp.NodePort = 30080
	none := svcPort("ns", "none", "http", "198.18.0.11", 80, dataplane.TCP)
	none.NodePort = 30081
	return dataplane.State{Services: []dataplane.ServicePort{sp, none}}
}

func TestLocalhostNodePorts(t *testing.T) {
	acct := &fakeAcct{}
	_, rs := localhostSync(t, localhostState(), true, acct, 4)
	split := map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90}
	traceCases(t, rs, []traceCase{
		// Masqueraded: the pod answers the node, which un-DNATs to 127.0.0.1.
		{"127.0.0.1 node port from the node", "127.0.0.1", "127.0.0.1", 30080, true, true, split, "all"},
		{"127.0.0.53 node port from the node", "127.0.0.1", "127.0.0.53", 30080, true, true, split, "all"},
		{"node port on a node address still", "198.19.254.1", "198.19.254.1", 30080, true, true, split, "all"},
		{"127.0.0.1 node port without endpoints: refused", "127.0.0.1", "127.0.0.1", 30081, true, true, map[string]float64{"REJECT": 100}, "none"},
		{"127.0.0.1 other port from the node: untouched", "127.0.0.1", "127.0.0.1", 22, true, true, map[string]float64{"ACCEPT": 100}, "none"},
		// route_localnet=1 would deliver these; the martian drop does not.
		{"127.0.0.1 node port from a LAN client: dropped, not DNATed", "198.19.254.2", "127.0.0.1", 30080, false, true, map[string]float64{"DROP": 100}, "none"},
		{"127.0.0.1 other port from a LAN client: dropped", "198.19.254.2", "127.0.0.1", 22, false, true, map[string]float64{"DROP": 100}, "none"},
		{"127.0.0.1 from a pod: dropped", "198.19.1.9", "127.0.0.1", 22, false, true, map[string]float64{"DROP": 100}, "none"},
	})
	if _, err := acct.Get(LocalhostCounter); err != nil {
		t.Errorf("the nfacct object was not created before the restore: %v", err)
	}
	counting := 0
	for _, r := range rs.Chain(TableFilter, ChainServices).Rules {
		if strings.Contains(r.Text, "--nfacct-name "+LocalhostCounter) {
			counting++
			if r.Jump != "" || !strings.Contains(r.Text, "--ctstate DNAT --ctorigdst 127.0.0.0/8") {
				t.Errorf("counting rule %q: want a DNAT-from-loopback match and no target", r.Text)
			}
		}
	}
	if counting != 1 {
		t.Errorf("%d nfacct counting rules in filter %s, want 1", counting, ChainServices)
	}
}

func TestLocalhostNodePortsOff(t *testing.T) {
	acct := &fakeAcct{}
	_, rs := localhostSync(t, localhostState(), false, acct, 4)
	got, _ := traceFrom(t, rs, "127.0.0.1", "127.0.0.1", 30080, true, true)
	wantShares(t, "127.0.0.1 node port, off", got, map[string]float64{"ACCEPT": 100})
	got, _ = traceFrom(t, rs, "198.19.254.2", "198.19.254.1", 30080, false, true)
	wantShares(t, "node address, off", got, map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90})
	if fw := rs.Chain(TableFilter, ChainFirewall); fw == nil || len(fw.Rules) != 0 {
		t.Errorf("%s: %+v, want present and empty", ChainFirewall, fw)
	}
	if len(acct.objs) != 0 {
		t.Errorf("nfacct objects created while off: %v", acct.objs)
	}
}

// IPv6 has no route_localnet: the ip6tables proxier writes none of it.
func TestLocalhostNodePortsNotIPv6(t *testing.T) {
	v6 := svcPort("ns", "web6", "http", "2001:2::a", 80, dataplane.TCP, be("2001:2:0:1::2", 8080, 1))
	v6.NodePort = 30080
	acct := &fakeAcct{}
	f, _ := localhostSync(t, dataplane.State{Services: []dataplane.ServicePort{v6}}, true, acct, 6)
	saved, err := f.SaveAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(saved), "127.0.0.0/8") || strings.Contains(string(saved), "nfacct") {
		t.Errorf("IPv6 tables hold localhost rules:\n%s", saved)
	}
	if len(acct.objs) != 0 {
		t.Errorf("nfacct objects created for IPv6: %v", acct.objs)
	}
}

// Without nfacct the node ports still open on loopback, uncounted; the
// counter comes with the first full sync that can create it.
func TestLocalhostNodePortsWithoutNFAcct(t *testing.T) {
	acct := &fakeAcct{fail: errors.New("nfnetlink_acct: protocol not supported")}
	cfg := parityCfg
	cfg.LocalhostNodePorts, cfg.NFAcct, cfg.Family = true, acct, 4
	f := NewFake()
	p := NewProxier(f, cfg)
	s := localhostState()
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatalf("sync without nfacct: %v", err)
	}
	rs := f.Ruleset()
	got, _ := traceFrom(t, rs, "127.0.0.1", "127.0.0.1", 30080, true, true)
	wantShares(t, "127.0.0.1 node port without nfacct", got, map[string]float64{"198.19.1.2:8080": 10, "198.19.1.3:8080": 90})
	if saved, _ := f.SaveAll(); strings.Contains(string(saved), "nfacct") {
		t.Errorf("a rule names an nfacct object that does not exist:\n%s", saved)
	}
	acct.fail = nil
	if _, err := p.Sync(s, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	if saved, _ := f.SaveAll(); !strings.Contains(string(saved), "--nfacct-name "+LocalhostCounter) {
		t.Errorf("nfacct available again: no counting rule after a full sync:\n%s", saved)
	}
}
