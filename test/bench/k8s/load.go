package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/steelyard-net/steelyard/test/controlplane"
	"github.com/steelyard-net/steelyard/test/sandbox"
)

// The objects. Services get their ClusterIP from the API server
// (controlplane.ServiceClusterIPRange, 198.18.0.0/16); endpoints and the
// node are in 198.19.0.0/16 (see epAddr and changeAddr).
const (
	benchNS      = "bench"
	nodeName     = "node1"
	managedBy    = "steelyard-bench"
	endpointPort = 8080
)

// world is the API content of one control plane: N Services with one
// EndpointSlice each, and the client that changes them.
type world struct {
	client    kubernetes.Interface
	services  int
	endpoints int
	slices    []*discoveryv1.EndpointSlice // by Service index; the last version written
	vips      []netip.Addr                 // by Service index: the ClusterIP
	changes   int                          // addresses handed out by changeAddr
	// loadTime is how long creating the Services and slices took (both
	// methods: until the API server lists every slice).
	loadTime time.Duration
}

// epAddr is endpoint j of Service i: consecutive addresses in the pod range
// 198.19.1.0-198.19.127.255, wrapping (Services may share addresses, as
// Services selecting the same pods do; the 10 of one Service differ).
func epAddr(i, j, perService int) string {
	const first, count = 1 << 8, 128<<8 - 1<<8
	k := first + (i*perService+j)%count
	return netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}).String()
}

// changeAddr returns a fresh address for a changed endpoint, never used
// before in this control plane, from 198.19.128.0-198.19.253.255 (outside
// the initial endpoints, so its appearance in the kernel is unambiguous).
func (w *world) changeAddr() (string, error) {
	const first, count = 128 << 8, 126 << 8
	if w.changes >= count {
		return "", errors.New("out of change addresses")
	}
	k := first + w.changes
	w.changes++
	return netip.AddrFrom4([4]byte{198, 19, byte(k >> 8), byte(k)}).String(), nil
}

// load creates the namespace, the Node (with the sandbox's node address as
// InternalIP: kube-proxy waits for one) and n Services
// with m endpoints each, from workers clients in parallel: through the
// API (method "api") or written into etcd (method "etcd", seed.go).
func load(ctx context.Context, cp *controlplane.ControlPlane, n, m, workers int, method string, logf func(string, ...any)) (*world, error) {
	c := cp.Client()
	w := &world{client: c, services: n, endpoints: m, slices: make([]*discoveryv1.EndpointSlice, n), vips: make([]netip.Addr, n)}
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	node, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: sandbox.NodeIP.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}

	start := time.Now()
	if method == "etcd" {
		if err := seedEtcd(ctx, cp.EtcdURL, n, m, workers, logf); err != nil {
			return nil, err
		}
		if err := w.readBack(ctx, start, logf); err != nil {
			return nil, err
		}
		w.loadTime = time.Since(start)
		logf("load: %d Services x %d endpoints written to etcd and listed by the API server in %v", n, m, w.loadTime.Round(time.Millisecond))
		return w, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next    atomic.Int64
		done    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		firstEr error
	)
	for range workers {
		wc := cp.Client() // one connection and rate limiter per worker
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				vip, s, err := createService(ctx, wc, i, m)
				if err != nil {
					errOnce.Do(func() { firstEr = err; cancel() })
					return
				}
				w.slices[i], w.vips[i] = s, vip
				if d := done.Add(1); d%2000 == 0 {
					logf("load: %d/%d Services in %v", d, n, time.Since(start).Round(time.Second))
				}
			}
		})
	}
	wg.Wait()
	if firstEr != nil {
		return nil, firstEr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w.loadTime = time.Since(start)
	logf("load: %d Services x %d endpoints in %v (%.0f objects/s)", n, m, w.loadTime.Round(time.Millisecond),
		float64(2*n)/w.loadTime.Seconds())
	return w, nil
}

// readBack lists the EndpointSlices through the API server until it has
// every one (it sees etcd's writes through its watch), and keeps them for
// changeEndpoint, with each Service's ClusterIP.
func (w *world) readBack(ctx context.Context, start time.Time, logf func(string, ...any)) error {
	for i := range w.services {
		w.vips[i] = clusterIP(i)
	}
	for {
		got := 0
		cont := ""
		for {
			l, err := w.client.DiscoveryV1().EndpointSlices(benchNS).List(ctx, metav1.ListOptions{Limit: 5000, Continue: cont})
			if err != nil {
				return fmt.Errorf("list EndpointSlices: %w", err)
			}
			for k := range l.Items {
				s := &l.Items[k]
				var i int
				if _, err := fmt.Sscanf(s.Name, "svc-%d-1", &i); err == nil && i >= 0 && i < w.services {
					if w.slices[i] == nil {
						got++
					}
					w.slices[i] = s
				}
			}
			if cont = l.Continue; cont == "" {
				break
			}
		}
		if got == w.services || countSet(w.slices) == w.services {
			return nil
		}
		logf("load: the API server lists %d of %d EndpointSlices after %v", countSet(w.slices), w.services, time.Since(start).Round(time.Second))
		if !sleep(ctx, 2*time.Second) {
			return ctx.Err()
		}
	}
}

func countSet(s []*discoveryv1.EndpointSlice) int {
	n := 0
	for _, x := range s {
		if x != nil {
			n++
		}
	}
	return n
}

// newSlice is the EndpointSlice of Service i with m endpoints.
func newSlice(i, m int) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%d", i)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name + "-1",
			Labels: map[string]string{
				discoveryv1.LabelServiceName: name,
				discoveryv1.LabelManagedBy:   managedBy,
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](endpointPort)}},
	}
	for j := range m {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{epAddr(i, j, m)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
		})
	}
	return slice
}

func createService(ctx context.Context, c kubernetes.Interface, i, m int) (netip.Addr, *discoveryv1.EndpointSlice, error) {
	name := fmt.Sprintf("svc-%d", i)
	svc, err := c.CoreV1().Services(benchNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(endpointPort),
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("create Service %s: %w", name, err)
	}
	vip, _ := netip.ParseAddr(svc.Spec.ClusterIP)
	s, err := c.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, newSlice(i, m), metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("create EndpointSlice %s-1: %w", name, err)
	}
	return vip, s, nil
}

// changeEndpoint gives endpoint j of Service i the address addr and stamps
// the slice's last-change-trigger-time with the time of the write, which
// it returns.
func (w *world) changeEndpoint(ctx context.Context, i, j int, addr string) (time.Time, error) {
	s := w.slices[i].DeepCopy()
	s.Endpoints[j].Addresses = []string{addr}
	t0 := time.Now()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[corev1.EndpointsLastChangeTriggerTime] = t0.Format(time.RFC3339Nano)
	out, err := w.client.DiscoveryV1().EndpointSlices(benchNS).Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return t0, fmt.Errorf("update EndpointSlice %s: %w", s.Name, err)
	}
	w.slices[i] = out
	return t0, nil
}
