package reconcile

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// Test addresses: VIPs 198.18.0.0/16, backends 198.19.0.0/16, one IPv6
// VIP in 2001:2::/48 (which fakeOps does not want).

// fakeKernel is a dataplane whose kernel is a map of Service port to the
// backend address it forwards to; a batch applies whole or not at all.
type fakeKernel struct {
	kernel map[string]string // port -> backend IP
	// batch holds the writes of the current batch (value "" deletes).
	batch map[string]string
	// failCommits refuses the commits whose numbers (from 1) it names.
	failCommits map[int]bool
	commits     int
	// calls logs the operations in order.
	calls    []string
	plan     Plan
	intact   bool
	beginErr error
	pruned   int
}

func newFake() *fakeKernel {
	return &fakeKernel{kernel: map[string]string{}, batch: map[string]string{}, intact: true}
}

func (f *fakeKernel) Wants(sp *dataplane.ServicePort) bool { return sp.Family() == 4 }
func (f *fakeKernel) Intact() bool                         { return f.intact }

func (f *fakeKernel) Begin(full bool, _ map[dataplane.ServicePortName]*dataplane.ServicePort) (Plan, error) {
	f.calls = append(f.calls, fmt.Sprintf("begin full=%v", full))
	return f.plan, f.beginErr
}

func (f *fakeKernel) Update(n dataplane.ServicePortName, old, sp *dataplane.ServicePort) *dataplane.ServicePort {
	f.calls = append(f.calls, "update "+n.String())
	f.batch[n.String()] = sp.Backends[0].IP.String()
	return sp
}

func (f *fakeKernel) Delete(n dataplane.ServicePortName, old *dataplane.ServicePort) {
	f.calls = append(f.calls, "delete "+n.String())
	f.batch[n.String()] = ""
}

func (f *fakeKernel) Prune(applied map[dataplane.ServicePortName]*dataplane.ServicePort) {
	f.calls = append(f.calls, "prune")
	for k := range f.kernel {
		if applied[name(k)] == nil {
			f.batch[k] = ""
			f.pruned++
		}
	}
}

func (f *fakeKernel) Commit(last bool) error {
	f.commits++
	f.calls = append(f.calls, fmt.Sprintf("commit last=%v", last))
	defer clear(f.batch)
	if f.failCommits[f.commits] {
		return errors.New("refused")
	}
	for k, v := range f.batch {
		if v == "" {
			delete(f.kernel, k)
		} else {
			f.kernel[k] = v
		}
	}
	return nil
}

func (f *fakeKernel) Done(full bool) { f.calls = append(f.calls, "done") }

func name(s string) dataplane.ServicePortName {
	ns, rest, _ := strings.Cut(s, "/")
	n, port, _ := strings.Cut(rest, ":")
	return dataplane.ServicePortName{Namespace: ns, Name: n, Port: port}
}

// port is Service port "ns/svc:p" at VIP vip:80 forwarding to backend.
func port(n, vip, backend string) dataplane.ServicePort {
	return dataplane.ServicePort{Name: name(n),
		VIP:      dataplane.VIP{IP: netip.MustParseAddr(vip), Port: 80, Protocol: "TCP"},
		Backends: []dataplane.Backend{{IP: netip.MustParseAddr(backend), Port: 8080, Weight: 1}}}
}

func state(ports ...dataplane.ServicePort) dataplane.State {
	s := dataplane.State{Services: ports}
	s.Sort()
	return s
}

func changed(svcs ...string) dataplane.SyncRequest {
	req := dataplane.SyncRequest{Changed: map[dataplane.ServiceName]bool{}}
	for _, s := range svcs {
		req.Changed[name(s+":x").Service()] = true
	}
	return req
}

func (f *fakeKernel) want(t *testing.T, kernel map[string]string) {
	t.Helper()
	if len(f.kernel) != len(kernel) {
		t.Fatalf("kernel holds %v, want %v", f.kernel, kernel)
	}
	for k, v := range kernel {
		if f.kernel[k] != v {
			t.Fatalf("kernel holds %v, want %v", f.kernel, kernel)
		}
	}
}

func (f *fakeKernel) wantCalls(t *testing.T, calls ...string) {
	t.Helper()
	if !slices.Equal(f.calls, calls) {
		t.Fatalf("calls:\n  %s\nwant:\n  %s", strings.Join(f.calls, "\n  "), strings.Join(calls, "\n  "))
	}
	f.calls = nil
}

func TestFirstSyncFullThenPartialWritesOnlyChanges(t *testing.T) {
	f, e := newFake(), New()
	a, b := port("ns/a:http", "198.18.0.1", "198.19.0.1"), port("ns/b:http", "198.18.0.2", "198.19.0.2")
	v6 := port("ns/c:http", "2001:2::1", "2001:2::2")
	// Something of a previous run: pruned by the first (full) Sync.
	f.kernel["ns/old:http"] = "198.19.0.9"
	res, err := e.Sync(state(a, b, v6), dataplane.PartialSync, f)
	if err != nil || !res.Full || res.Written != 2 {
		t.Fatalf("first sync: %+v, %v; want full, 2 written", res, err)
	}
	f.wantCalls(t, "begin full=true", "update ns/a:http", "update ns/b:http", "prune", "commit last=true", "done")
	f.want(t, map[string]string{"ns/a:http": "198.19.0.1", "ns/b:http": "198.19.0.2"})
	if f.pruned != 1 {
		t.Errorf("pruned %d objects, want 1", f.pruned)
	}

	// b changes, a is not named: only b is written; a partial Sync never
	// prunes.
	b2 := port("ns/b:http", "198.18.0.2", "198.19.0.3")
	f.kernel["ns/hand:http"] = "198.19.0.8"
	res, err = e.Sync(state(a, b2, v6), changed("ns/b"), f)
	if err != nil || res.Full || res.Written != 1 {
		t.Fatalf("partial sync: %+v, %v; want partial, 1 written", res, err)
	}
	f.wantCalls(t, "begin full=false", "update ns/b:http", "commit last=true", "done")
	// A Service named whose ports did not change writes nothing.
	if res, err = e.Sync(state(a, b2, v6), changed("ns/a"), f); err != nil || res.Written != 0 {
		t.Fatalf("unchanged port: %+v, %v", res, err)
	}
	f.calls = nil

	// a goes, d comes: removals first.
	d := port("ns/d:http", "198.18.0.1", "198.19.0.4")
	if _, err = e.Sync(state(b2, d, v6), changed("ns/a", "ns/d"), f); err != nil {
		t.Fatal(err)
	}
	f.wantCalls(t, "begin full=false", "delete ns/a:http", "update ns/d:http", "commit last=true", "done")

	// A full Sync prunes what others left.
	if res, err = e.Sync(state(b2, d, v6), dataplane.FullSync, f); err != nil || !res.Full || res.Written != 0 {
		t.Fatalf("full sync: %+v, %v", res, err)
	}
	f.want(t, map[string]string{"ns/b:http": "198.19.0.3", "ns/d:http": "198.19.0.4"})
	for _, n := range []string{"ns/b:http", "ns/d:http"} {
		if st := e.Status(name(n)); st != Done {
			t.Errorf("%s: %s, want done", n, st)
		}
	}
	if st := e.Status(name("ns/a:http")); st != Unknown {
		t.Errorf("removed port: %s, want unknown", st)
	}
	if s := e.Summary(); s != (Summary{Synced: true, Ports: 2}) {
		t.Errorf("summary %+v", s)
	}
}

func TestFailedBatchKeepsRecordAndRetriesFull(t *testing.T) {
	f, e := newFake(), New()
	a, b, c := port("ns/a:p", "198.18.0.1", "198.19.0.1"), port("ns/b:p", "198.18.0.2", "198.19.0.2"), port("ns/c:p", "198.18.0.3", "198.19.0.3")
	if _, err := e.Sync(state(a, b, c), dataplane.PartialSync, f); err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	// All three change; batches of one port; the second commit fails.
	a2, b2, c2 := port("ns/a:p", "198.18.0.1", "198.19.1.1"), port("ns/b:p", "198.18.0.2", "198.19.1.2"), port("ns/c:p", "198.18.0.3", "198.19.1.3")
	f.plan = Plan{Batch: 1}
	f.failCommits = map[int]bool{f.commits + 2: true}
	_, err := e.Sync(state(a2, b2, c2), changed("ns/a", "ns/b", "ns/c"), f)
	if err == nil {
		t.Fatal("a refused batch: no error")
	}
	f.wantCalls(t, "begin full=false", "update ns/a:p", "commit last=false", "update ns/b:p", "commit last=false")
	// The kernel holds a's first batch and nothing of b's: so does the record.
	f.want(t, map[string]string{"ns/a:p": "198.19.1.1", "ns/b:p": "198.19.0.2", "ns/c:p": "198.19.0.3"})
	for n, st := range map[string]Status{"ns/a:p": Done, "ns/b:p": Failed, "ns/c:p": Pending} {
		if got := e.Status(name(n)); got != st {
			t.Errorf("%s: %s, want %s", n, got, st)
		}
	}
	if got := e.Applied(name("ns/b:p")); !got.Equal(&b) {
		t.Errorf("record of the refused port: %+v, want its old value", got)
	}
	if s := e.Summary(); s != (Summary{Synced: false, Ports: 3, Pending: 1, Failed: 1}) {
		t.Errorf("summary %+v", s)
	}
	// The retry is full although asked partial, names nothing changed,
	// and writes the ports left behind.
	f.plan = Plan{}
	res, err := e.Sync(state(a2, b2, c2), changed(), f)
	if err != nil || !res.Full || res.Written != 2 {
		t.Fatalf("retry: %+v, %v; want full, 2 written", res, err)
	}
	f.wantCalls(t, "begin full=true", "update ns/b:p", "update ns/c:p", "prune", "commit last=true", "done")
	f.want(t, map[string]string{"ns/a:p": "198.19.1.1", "ns/b:p": "198.19.1.2", "ns/c:p": "198.19.1.3"})
	if s := e.Summary(); s != (Summary{Synced: true, Ports: 3}) {
		t.Errorf("summary after the retry %+v", s)
	}
}

func TestFailedRemovalPutsRecordBack(t *testing.T) {
	f, e := newFake(), New()
	a, b := port("ns/a:p", "198.18.0.1", "198.19.0.1"), port("ns/a:q", "198.18.0.1", "198.19.0.2")
	if _, err := e.Sync(state(a, b), dataplane.PartialSync, f); err != nil {
		t.Fatal(err)
	}
	f.failCommits = map[int]bool{f.commits + 1: true}
	if _, err := e.Sync(state(a), changed("ns/a"), f); err == nil {
		t.Fatal("no error")
	}
	if got := e.AppliedOf(name("ns/a:p").Service()); len(got) != 2 {
		t.Errorf("ports of ns/a after a refused removal: %v, want both", got)
	}
	if e.Applied(name("ns/a:q")) == nil {
		t.Error("the refused removal's port left the record")
	}
	if _, err := e.Sync(state(a), changed("ns/a"), f); err != nil {
		t.Fatal(err)
	}
	f.want(t, map[string]string{"ns/a:p": "198.19.0.1"})
	if got := e.AppliedOf(name("ns/a:p").Service()); len(got) != 1 {
		t.Errorf("ports of ns/a: %v", got)
	}
}

func TestGoneObjectsMakeTheSyncFull(t *testing.T) {
	f, e := newFake(), New()
	a := port("ns/a:p", "198.18.0.1", "198.19.0.1")
	if _, err := e.Sync(state(a), dataplane.PartialSync, f); err != nil {
		t.Fatal(err)
	}
	// Flushed by hand: the kernel lost everything, the record did not.
	clear(f.kernel)
	f.intact = false
	f.calls = nil
	f.plan = Plan{Rewrite: []dataplane.ServicePortName{name("ns/a:p"), name("ns/gone:p")}}
	res, err := e.Sync(state(a), changed(), f)
	if err != nil || !res.Full {
		t.Fatalf("%+v, %v; want full", res, err)
	}
	// Rewrite names a port the state lost: ignored.
	f.wantCalls(t, "begin full=true", "update ns/a:p", "prune", "commit last=true", "done")
	f.want(t, map[string]string{"ns/a:p": "198.19.0.1"})
}

func TestFailedBeginChangesNothing(t *testing.T) {
	f, e := newFake(), New()
	a := port("ns/a:p", "198.18.0.1", "198.19.0.1")
	f.beginErr = errors.New("cannot list")
	if _, err := e.Sync(state(a), dataplane.PartialSync, f); err == nil {
		t.Fatal("no error")
	}
	if e.Synced() || e.Applied(name("ns/a:p")) != nil {
		t.Error("a Sync that never wrote changed the record")
	}
	if _, err := e.Sync(state(a), dataplane.PartialSync, f); err == nil {
		t.Fatal("no error")
	}
	f.beginErr = nil
	if res, err := e.Sync(state(a), dataplane.PartialSync, f); err != nil || !res.Full {
		t.Fatalf("%+v, %v", res, err)
	}
	// After a success, a failed Begin makes the next Sync full too.
	f.beginErr = errors.New("cannot list")
	if _, err := e.Sync(state(a), changed("ns/a"), f); err == nil {
		t.Fatal("no error")
	}
	f.beginErr = nil
	if res, err := e.Sync(state(a), changed("ns/a"), f); err != nil || !res.Full {
		t.Fatalf("after a failed Begin: %+v, %v; want full", res, err)
	}
	e.Reset()
	if e.Synced() || len(e.AppliedPorts()) != 0 {
		t.Error("Reset kept the record")
	}
}
