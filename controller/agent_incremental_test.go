package controller

import (
	"context"
	"math/rand"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/steelyard-net/steelyard/dataplane"
)

// syncLog keeps every State and request it was given.
type syncLog struct {
	states []dataplane.State
	reqs   []dataplane.SyncRequest
}

func (d *syncLog) Sync(s dataplane.State, req dataplane.SyncRequest) (dataplane.SyncResult, error) {
	d.states = append(d.states, s)
	d.reqs = append(d.reqs, req)
	return dataplane.SyncResult{Full: req.Full}, nil
}
func (d *syncLog) Explain() ([]dataplane.ServiceView, error) { return nil, nil }
func (d *syncLog) Cleanup() error                            { return nil }

// The agent over a real ClusterSource (fake API server, real watch store
// and tracker): random creates, updates and deletes of Services and
// slices, a partial sync after each, and the State the dataplane gets must
// be what a Build of every object gives, with every Service whose ports
// differ from the previous sync's in the request's changed set.
func TestAgentIncrementalOverClusterSource(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := fake.NewClientset()
	src, err := NewClusterSource(client, ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	d := &syncLog{}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := NewMetrics()
	a := &Agent{Source: src, Tracker: src.Tracker, Builder: NewBuilder(), Dataplane: d, FullSyncPeriod: time.Hour, Clock: clk, Metrics: m}
	full := NewBuilder()
	r := rand.New(rand.NewSource(7))
	live := map[objectKey]bool{}
	var prev dataplane.State
	for step := 0; step < 120; step++ {
		ns := propNamespaces[r.Intn(len(propNamespaces))]
		mark := strconv.Itoa(step)
		var k objectKey
		del := false
		if r.Intn(2) == 0 {
			n := types.NamespacedName{Namespace: ns, Name: propServices[r.Intn(len(propServices))]}
			k = objectKey{KindService, n}
			svcs := client.CoreV1().Services(ns)
			switch {
			case live[k] && r.Intn(4) == 0:
				err, del = svcs.Delete(ctx, n.Name, metav1.DeleteOptions{}), true
			case live[k]:
				obj := randomService(r, n)
				annotate(&obj.ObjectMeta, "test/step", mark)
				old, _ := svcs.Get(ctx, n.Name, metav1.GetOptions{})
				obj.UID = old.UID
				_, err = svcs.Update(ctx, obj, metav1.UpdateOptions{})
			default:
				obj := randomService(r, n)
				annotate(&obj.ObjectMeta, "test/step", mark)
				_, err = svcs.Create(ctx, obj, metav1.CreateOptions{})
			}
		} else {
			n := types.NamespacedName{Namespace: ns, Name: propSlices[r.Intn(len(propSlices))]}
			k = objectKey{KindEndpointSlice, n}
			sls := client.DiscoveryV1().EndpointSlices(ns)
			switch {
			case live[k] && r.Intn(4) == 0:
				err, del = sls.Delete(ctx, n.Name, metav1.DeleteOptions{}), true
			case live[k]:
				obj := randomSlice(r, n)
				annotate(&obj.ObjectMeta, "test/step", mark)
				old, _ := sls.Get(ctx, n.Name, metav1.GetOptions{})
				obj.UID = old.UID
				_, err = sls.Update(ctx, obj, metav1.UpdateOptions{})
			default:
				obj := randomSlice(r, n)
				annotate(&obj.ObjectMeta, "test/step", mark)
				_, err = sls.Create(ctx, obj, metav1.CreateOptions{})
			}
		}
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		live[k] = !del
		waitForStore(t, src, k, mark, del)
		clk.Step(time.Second)
		if err := a.Sync(); err != nil {
			t.Fatal(err)
		}
		svcs, slices, _ := src.Load()
		want, _ := full.Build(svcs, slices)
		got, req := d.states[len(d.states)-1], d.reqs[len(d.reqs)-1]
		if diff := stateDiff(got, want); diff != "" {
			t.Fatalf("step %d: the agent's State differs from a full Build:\n%s", step, diff)
		}
		if step > 0 && !req.Full && req.Changed != nil {
			for n := range servicesThatDiffer(prev, want) {
				if !req.Changed[n] {
					t.Fatalf("step %d: %s changed but the request names %v", step, n, req.Changed)
				}
			}
		}
		if step > 0 && req.Full {
			t.Fatalf("step %d: a full sync within the full-sync period", step)
		}
		// The gauge is recounted per changed Service on partial syncs.
		wantEps := 0
		for i := range want.Services {
			wantEps += len(want.Services[i].Active())
		}
		var g dto.Metric
		if err := m.ProgrammedEndpoints.Write(&g); err != nil {
			t.Fatal(err)
		}
		if got := g.GetGauge().GetValue(); got != float64(wantEps) {
			t.Fatalf("step %d: steelyard_programmed_endpoints %v, want %d", step, got, wantEps)
		}
		prev = want
	}
}

// waitForStore waits until the source's store shows the change of step
// mark to object k (or its deletion).
func waitForStore(t *testing.T, src *ClusterSource, k objectKey, mark string, deleted bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		svcs, slices, _ := src.Load()
		var found metav1.Object
		if k.kind == KindService {
			for _, s := range svcs {
				if s.Namespace == k.name.Namespace && s.Name == k.name.Name {
					found = s
				}
			}
		} else {
			for _, s := range slices {
				if s.Namespace == k.name.Namespace && s.Name == k.name.Name {
					found = s
				}
			}
		}
		if deleted && found == nil || !deleted && found != nil && found.GetAnnotations()["test/step"] == mark {
			return
		}
	}
	t.Fatalf("the store never showed %v at step %s", k, mark)
}

func (d *syncLog) Counts() ([]dataplane.EndpointCount, error) { return nil, nil }
