package nftables

import (
	"context"
	"errors"
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/steelyard-net/steelyard/dataplane"
)

// failingNFT fails the Run calls whose number (from 1) is in fail, without
// running them: the kernel commits nothing of a failed transaction.
type failingNFT struct {
	knftables.Interface
	runs int
	fail map[int]bool
}

var errCommit = errors.New("commit refused (test)")

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	f.runs++
	if f.fail[f.runs] {
		return errCommit
	}
	return f.Interface.Run(ctx, tx)
}

// checkKernel traces the table against st.
func checkKernel(t *testing.T, p *Proxier, st dataplane.State) {
	t.Helper()
	wantServed(t, "kernel", p, st)
}

// A failed commit leaves the record as the kernel is (the journal is
// replayed), so the next sync writes the change that failed: weights of b,
// a gone, and a's VIP taken by c. Were the record left as the failed sync
// built it, the full resync after the failure would take b and c as
// written and leave the kernel as it was.
func TestFailedCommitIsRepairedByTheNextSync(t *testing.T) {
	for _, changed := range []map[dataplane.ServiceName]bool{nil, {{Namespace: "default", Name: "a"}: true, {Namespace: "default", Name: "b"}: true, {Namespace: "default", Name: "c"}: true}} {
		p, nft := newTest(t, 4)
		a := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
		b := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 1))
		st := dataplane.State{Services: []dataplane.ServicePort{a, b}}
		if _, err := p.Sync(st, dataplane.FullSync); err != nil {
			t.Fatal(err)
		}
		b2 := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1), be("198.19.1.5", 8080, 9))
		c := svcPort("c", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.6", 8080, 1))
		st2 := dataplane.State{Services: []dataplane.ServicePort{b2, c}}
		f := &failingNFT{Interface: nft, fail: map[int]bool{1: true}}
		p.nft = f
		if _, err := p.Sync(st2, dataplane.SyncRequest{Changed: changed}); !errors.Is(err, errCommit) {
			t.Fatalf("sync: %v, want the commit's error", err)
		}
		p.nft = nft           // explain reads the Fake
		checkKernel(t, p, st) // nothing of the failed sync is in
		// The agent retries with the same request; the Proxier goes full.
		res, err := p.Sync(st2, dataplane.SyncRequest{Changed: changed})
		if err != nil || !res.Full {
			t.Fatalf("retry: %+v, %v; want a full sync", res, err)
		}
		checkKernel(t, p, st2)
		// And a partial sync after it starts from the right record.
		b3 := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 3), be("198.19.1.5", 8080, 1))
		st3 := dataplane.State{Services: []dataplane.ServicePort{b3, c}}
		if _, err := p.Sync(st3, dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{b3.Name.Service(): true}}); err != nil {
			t.Fatal(err)
		}
		checkKernel(t, p, st3)
	}
}

// A first sync in batches that fails half-way keeps what the committed
// batches wrote; the next sync writes the rest.
func TestFailedBatchIsRepairedByTheNextSync(t *testing.T) {
	defer func(n int) { BatchPorts = n }(BatchPorts)
	BatchPorts = 1
	p, nft := newTest(t, 4)
	var st dataplane.State
	for i, n := range []string{"a", "b", "c", "d"} {
		ip := []string{"198.18.0.10", "198.18.0.11", "198.18.0.12", "198.18.0.13"}[i]
		st.Services = append(st.Services, svcPort(n, ip, 80, dataplane.TCP, be("198.19.1.2", uint16(8080+i), 1), be("198.19.1.3", 8080, float64(1+i))))
	}
	f := &failingNFT{Interface: nft, fail: map[int]bool{3: true}}
	p.nft = f
	if _, err := p.Sync(st, dataplane.FullSync); !errors.Is(err, errCommit) {
		t.Fatalf("first sync: %v, want the commit's error", err)
	}
	p.nft = nft
	if got := len(p.eng.AppliedPorts()); got != 2 {
		t.Errorf("record holds %d ports after two batches, want 2", got)
	}
	if _, err := p.Sync(st, dataplane.PartialSync); err != nil {
		t.Fatal(err)
	}
	checkKernel(t, p, st)
}

// A partial sync with the Builder's set looks at the named Services only
// and trusts it: their ports are written, added and deleted; a change of
// a Service it does not name (which a correct set never has) stays
// unwritten until a full sync, which compares every port and repairs it.
func TestChangedSetIsTrusted(t *testing.T) {
	p, _ := newTest(t, 4)
	a := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.2", 8080, 1))
	b := svcPort("b", "198.18.0.12", 80, dataplane.TCP, be("198.19.1.4", 8080, 1))
	c := svcPort("c", "198.18.0.14", 80, dataplane.TCP, be("198.19.1.6", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a, b, c}}, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	named := func(ns ...string) map[dataplane.ServiceName]bool {
		m := map[dataplane.ServiceName]bool{}
		for _, n := range ns {
			m[dataplane.ServiceName{Namespace: "default", Name: n}] = true
		}
		return m
	}
	// b is deleted and named; a changes but is not named: kept as written.
	a2 := svcPort("a", "198.18.0.10", 80, dataplane.TCP, be("198.19.1.3", 8080, 1))
	if _, err := p.Sync(dataplane.State{Services: []dataplane.ServicePort{a2, c}}, dataplane.SyncRequest{Changed: named("b")}); err != nil {
		t.Fatal(err)
	}
	checkKernel(t, p, dataplane.State{Services: []dataplane.ServicePort{a, c}})
	// a gets a second port (named); c is deleted and d added without
	// being named: the kernel keeps c and lacks d.
	d := svcPort("d", "198.18.0.16", 80, dataplane.TCP, be("198.19.1.8", 8080, 1))
	a3 := svcPort("a", "198.18.0.10", 81, dataplane.TCP, be("198.19.1.2", 8081, 1))
	a3.Name.Port = "admin"
	st := dataplane.State{Services: []dataplane.ServicePort{a, a3, d}}
	st.Sort()
	if _, err := p.Sync(st, dataplane.SyncRequest{Changed: named("a")}); err != nil {
		t.Fatal(err)
	}
	checkKernel(t, p, dataplane.State{Services: []dataplane.ServicePort{a, a3, c}})
	// a loses its first port.
	st = dataplane.State{Services: []dataplane.ServicePort{a3, d}}
	if _, err := p.Sync(st, dataplane.SyncRequest{Changed: named("a")}); err != nil {
		t.Fatal(err)
	}
	if got := p.eng.AppliedOf(a.Name.Service()); len(got) != 1 || got[0] != a3.Name {
		t.Errorf("ports of a: %v", got)
	}
	checkKernel(t, p, dataplane.State{Services: []dataplane.ServicePort{a3, c}})
	// The full sync repairs what the set did not name.
	if _, err := p.Sync(st, dataplane.FullSync); err != nil {
		t.Fatal(err)
	}
	checkKernel(t, p, st)
}
