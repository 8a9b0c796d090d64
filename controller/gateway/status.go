package gateway

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)

// LeaseName is the Lease that elects the one status writer.
const LeaseName = "steelyard-gateway-status"

// StatusWriter writes the status of each translation to the API server,
// on one agent only: the holder of a Lease (client-go leaderelection).
//
// Why a leader and not a writer per node: every agent computes the same
// status, but N agents updating the same objects would conflict on every
// write (N-1 lost optimistic-concurrency races per change, N times the API
// load) and would flap lastTransitionTime whenever their caches differ for
// a moment. Traffic does not depend on the leader: every node programs
// routes from its own informers; a leader change only delays status.
type StatusWriter struct {
	Source *Source
	GW     versioned.Interface
	Kube   kubernetes.Interface
	// Identity is this agent's name in the Lease (the node name);
	// Namespace is where the Lease lives.
	Identity, Namespace string

	leader atomic.Bool
	poke   chan struct{}
	done   chan struct{}
}

// IsLeader reports whether this agent writes status now.
func (w *StatusWriter) IsLeader() bool { return w.leader.Load() }

// Run campaigns for the Lease and, while it holds it, writes the status of
// every translation. It returns when ctx is done.
func (w *StatusWriter) Run(ctx context.Context) error {
	w.poke = make(chan struct{}, 1)
	w.done = make(chan struct{})
	w.Source.setNotify(w.trigger)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, w.Namespace, LeaseName,
		w.Kube.CoreV1(), w.Kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: w.Identity})
	if err != nil {
		return err
	}
	l := log.WithFields(logrus.Fields{"lease": w.Namespace + "/" + LeaseName, "identity": w.Identity})
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			// kube-controller-manager's defaults: 15 s lease, renew
			// within 10 s, retry every 2 s.
			leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
				ReleaseOnCancel: true,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(lctx context.Context) {
						l.Info("writing Gateway API status (leader)")
						w.leader.Store(true)
						w.trigger()
						w.loop(lctx)
					},
					OnStoppedLeading: func() {
						w.leader.Store(false)
						l.Info("not writing Gateway API status (not the leader)")
					},
				},
			})
		}
	}()
	return nil
}

// Done is closed when Run's campaign has ended after ctx was done: the
// Lease is then released (when held), so another agent takes over at once
// instead of after the lease duration. Wait for it before exiting.
func (w *StatusWriter) Done() <-chan struct{} { return w.done }

func (w *StatusWriter) trigger() {
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// loop writes status after each translation while ctx (the leadership) lasts.
func (w *StatusWriter) loop(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.poke:
		case <-retry.C:
		}
		if res := w.Source.latest(); res != nil && !w.write(ctx, res) {
			retry.Reset(time.Second) // a conflict or an outage: try again soon
		}
	}
}

// write brings every object's status to res; false when a write failed.
func (w *StatusWriter) write(ctx context.Context, res *Result) bool {
	ok := true
	now := metav1.Now()
	fail := func(kind, name string, err error) {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			log.WithFields(logrus.Fields{fieldKind: kind, fieldObject: name}).WithError(err).Debug("status write lost a race, retrying")
		} else {
			log.WithFields(logrus.Fields{fieldKind: kind, fieldObject: name}).WithError(err).Warn("status write failed, retrying")
		}
		ok = false
	}
	v1 := w.GW.GatewayV1()
	for name, conds := range res.Classes {
		c, err := w.Source.classes.Get(name)
		if err != nil {
			continue
		}
		merged := mergeConditions(c.Status.Conditions, conds, now)
		if apiequality.Semantic.DeepEqual(merged, c.Status.Conditions) {
			continue
		}
		c = c.DeepCopy()
		c.Status.Conditions = merged
		if _, err := v1.GatewayClasses().UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			fail("GatewayClass", name, err)
		}
	}
	for key, st := range res.Gateways {
		g, err := w.Source.gateways.Gateways(key.Namespace).Get(key.Name)
		if err != nil {
			continue
		}
		want := st
		want.Conditions = mergeConditions(g.Status.Conditions, st.Conditions, now)
		want.Listeners = make([]gwv1.ListenerStatus, len(st.Listeners))
		for i, ls := range st.Listeners {
			want.Listeners[i] = ls
			var prev []metav1.Condition
			if j := slices.IndexFunc(g.Status.Listeners, func(x gwv1.ListenerStatus) bool { return x.Name == ls.Name }); j >= 0 {
				prev = g.Status.Listeners[j].Conditions
			}
			want.Listeners[i].Conditions = mergeConditions(prev, ls.Conditions, now)
		}
		want.AttachedListenerSets = g.Status.AttachedListenerSets
		if apiequality.Semantic.DeepEqual(want, g.Status) {
			continue
		}
		g = g.DeepCopy()
		g.Status = want
		if _, err := v1.Gateways(key.Namespace).UpdateStatus(ctx, g, metav1.UpdateOptions{}); err != nil {
			fail("Gateway", key.String(), err)
		}
	}
	opts := metav1.UpdateOptions{}
	tcp, _ := w.Source.tcpRoutes.List(everything)
	writeRoutes(ctx, KindTCPRoute, tcp, res, now, fail, func(r *gwv1.TCPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ctx context.Context, r *gwv1.TCPRoute) error {
			_, err := v1.TCPRoutes(r.Namespace).UpdateStatus(ctx, r, opts)
			return err
		})
	udp, _ := w.Source.udpRoutes.List(everything)
	writeRoutes(ctx, KindUDPRoute, udp, res, now, fail, func(r *gwv1.UDPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ctx context.Context, r *gwv1.UDPRoute) error {
			_, err := v1.UDPRoutes(r.Namespace).UpdateStatus(ctx, r, opts)
			return err
		})
	hr, _ := w.Source.httpRoutes.List(everything)
	writeRoutes(ctx, KindHTTPRoute, hr, res, now, fail, func(r *gwv1.HTTPRoute) *gwv1.RouteStatus { return &r.Status.RouteStatus },
		func(ctx context.Context, r *gwv1.HTTPRoute) error {
			_, err := v1.HTTPRoutes(r.Namespace).UpdateStatus(ctx, r, opts)
			return err
		})
	return ok
}

// statusObject is what writeRoutes needs of a route object.
type statusObject[R any] interface {
	metav1.Object
	DeepCopy() R
}

// writeRoutes writes the parents of each route of one kind whose status res
// changes; status returns the route's RouteStatus, update writes it.
func writeRoutes[R statusObject[R]](ctx context.Context, kind string, routes []R, res *Result, now metav1.Time,
	fail func(kind, name string, err error), status func(R) *gwv1.RouteStatus, update func(context.Context, R) error) {
	for _, r := range routes {
		name := r.GetNamespace() + "/" + r.GetName()
		parents, changed := routeParents(status(r).Parents, res.RouteParents[kind+"/"+name], now)
		if !changed {
			continue
		}
		r = r.DeepCopy()
		status(r).Parents = parents
		if err := update(ctx, r); err != nil {
			fail(kind, name, err)
		}
	}
}

// routeParents returns a route's parents with ours replaced by want (other
// controllers' entries kept as they are), and whether that changes them.
func routeParents(cur, want []gwv1.RouteParentStatus, now metav1.Time) ([]gwv1.RouteParentStatus, bool) {
	var out []gwv1.RouteParentStatus
	for _, p := range cur {
		if p.ControllerName != ControllerName {
			out = append(out, p)
		}
	}
	for _, p := range want {
		var prev []metav1.Condition
		if i := slices.IndexFunc(cur, func(x gwv1.RouteParentStatus) bool {
			return x.ControllerName == ControllerName && apiequality.Semantic.DeepEqual(x.ParentRef, p.ParentRef)
		}); i >= 0 {
			prev = cur[i].Conditions
		}
		p.Conditions = mergeConditions(prev, p.Conditions, now)
		out = append(out, p)
	}
	if len(out) == 0 && len(cur) == 0 {
		return cur, false
	}
	return out, !apiequality.Semantic.DeepEqual(out, cur)
}

// mergeConditions returns want with lastTransitionTime kept from prev
// where a condition's status did not change, and now where it did.
func mergeConditions(prev, want []metav1.Condition, now metav1.Time) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	for _, c := range want {
		c.LastTransitionTime = now
		if i := slices.IndexFunc(prev, func(p metav1.Condition) bool { return p.Type == c.Type }); i >= 0 && prev[i].Status == c.Status {
			c.LastTransitionTime = prev[i].LastTransitionTime
		}
		out = append(out, c)
	}
	return out
}
