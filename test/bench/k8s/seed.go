package main

// Loading the API server straight through etcd (-load etcd, the default).
//
// Creating a Service through kube-apiserver v1.37 costs time in proportion
// to the Services already there: the ClusterIP allocator (the IPAddress
// allocator, locked on since 1.34) lists every IPAddress twice after each
// allocation to set two gauges (ipallocator.go, createIPAddress -> Used,
// Free). Loading 30,000 Services that way slowed to about 24 objects/s
// (docs/benchmarks.md, 2026-12-02: 20,000 in 17 min), which no benchmark
// window holds. So the objects are written into etcd as kube-apiserver
// itself stores them (protobuf, the storage versions, under its keys), with
// an IPAddress object per ClusterIP so that its repair loop finds nothing
// to fix; the running kube-apiserver sees them through its etcd watch, and
// the proxies list and watch them through it as usual. The Node and the
// namespace are still created through the API.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// etcdPrefix is kube-apiserver's default --etcd-prefix.
const etcdPrefix = "/registry"

// Keys as kube-apiserver makes them: Services under the special prefix
// "services/specs" (SpecialDefaultResourcePrefixes), the others under
// their resource name; namespaced ones with the namespace.
func serviceKey(ns, name string) string { return etcdPrefix + "/services/specs/" + ns + "/" + name }
func sliceKey(ns, name string) string   { return etcdPrefix + "/endpointslices/" + ns + "/" + name }
func ipAddressKey(ip string) string     { return etcdPrefix + "/ipaddresses/" + ip }

// clusterIP is Service i's ClusterIP: 198.18.4.0 onwards in the Service
// range (the API server's own "kubernetes" Service takes 198.18.0.1).
func clusterIP(i int) netip.Addr {
	k := 4<<8 + i
	return netip.AddrFrom4([4]byte{198, 18, byte(k >> 8), byte(k)})
}

// maxSeedServices is how many ClusterIPs clusterIP hands out in the /16.
const maxSeedServices = 1<<16 - 4<<8 - 2

// uid is a fixed, valid UID per kind and index: the same world every run.
func uid(kind byte, i int) types.UID {
	return types.UID(fmt.Sprintf("%08x-0000-4000-8000-%012x", kind, i))
}

// seedObjects returns Service i with m endpoints as kube-apiserver stores
// it: the Service (ClusterIP and the fields the API defaults set), its
// IPAddress and its EndpointSlice, each with its etcd key.
func seedObjects(i, m int, created metav1.Time) (svc *corev1.Service, ip *networkingv1.IPAddress, slice *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	vip := clusterIP(i).String()
	svc = &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS, UID: uid(1, i), CreationTimestamp: created},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeClusterIP,
			ClusterIP:             vip,
			ClusterIPs:            []string{vip},
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol},
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicySingleStack),
			SessionAffinity:       corev1.ServiceAffinityNone,
			InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster),
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(endpointPort),
			}},
		},
	}
	ip = &networkingv1.IPAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "IPAddress"},
		ObjectMeta: metav1.ObjectMeta{Name: vip, UID: uid(2, i), CreationTimestamp: created, Labels: map[string]string{
			networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol),
			networkingv1.LabelManagedBy:       "ipallocator.k8s.io",
		}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: benchNS, Name: name}},
	}
	slice = newSlice(i, m)
	slice.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
	slice.Namespace, slice.UID, slice.CreationTimestamp, slice.Generation = benchNS, uid(3, i), created, 1
	return svc, ip, slice
}

// storageEncode encodes obj as kube-apiserver stores it: protobuf (its
// default --storage-media-type) in gv, with the "k8s\x00" envelope.
func storageEncode(obj runtime.Object, gv schema.GroupVersion) ([]byte, error) {
	info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		return nil, fmt.Errorf("no protobuf serializer")
	}
	return runtime.Encode(scheme.Codecs.EncoderForVersion(info.Serializer, gv), obj)
}

// kv is one etcd put.
type kv struct {
	key   string
	value []byte
}

// seedPuts returns the puts of Service i: the IPAddress first, so that the
// API server's repair loop never sees a ClusterIP without one.
func seedPuts(i, m int, created metav1.Time) ([]kv, error) {
	svc, ip, slice := seedObjects(i, m, created)
	var out []kv
	for _, o := range []struct {
		key string
		obj runtime.Object
		gv  schema.GroupVersion
	}{
		{ipAddressKey(ip.Name), ip, networkingv1.SchemeGroupVersion},
		{serviceKey(benchNS, svc.Name), svc, corev1.SchemeGroupVersion},
		{sliceKey(benchNS, slice.Name), slice, discoveryv1.SchemeGroupVersion},
	} {
		b, err := storageEncode(o.obj, o.gv)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", o.key, err)
		}
		out = append(out, kv{o.key, b})
	}
	return out, nil
}

// txnBody is the JSON of etcd's gRPC gateway for one transaction of puts
// (POST /v3/kv/txn; keys and values base64).
func txnBody(puts []kv) ([]byte, error) {
	type put struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	type op struct {
		RequestPut put `json:"requestPut"`
	}
	var body struct {
		Success []op `json:"success"`
	}
	for _, p := range puts {
		body.Success = append(body.Success, op{put{base64.StdEncoding.EncodeToString([]byte(p.key)), base64.StdEncoding.EncodeToString(p.value)}})
	}
	return json.Marshal(body)
}

// seedTxnServices is how many Services one transaction writes: 3 puts
// each, under etcd's default --max-txn-ops of 128.
const seedTxnServices = 40

// seedEtcd writes n Services x m endpoints into the etcd at etcdURL from
// workers parallel writers.
func seedEtcd(ctx context.Context, etcdURL string, n, m, workers int, logf func(string, ...any)) error {
	if n > maxSeedServices {
		return fmt.Errorf("-load etcd: at most %d Services (ClusterIPs of one /16)", maxSeedServices)
	}
	created := metav1.NewTime(time.Now().Truncate(time.Second))
	client := &http.Client{Timeout: time.Minute}
	batches := make(chan int)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		firstEr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range workers {
		wg.Go(func() {
			for b := range batches {
				var puts []kv
				for i := b; i < min(b+seedTxnServices, n); i++ {
					p, err := seedPuts(i, m, created)
					if err == nil {
						puts = append(puts, p...)
						continue
					}
					mu.Lock()
					firstEr = err
					mu.Unlock()
					cancel()
					return
				}
				if err := etcdTxn(ctx, client, etcdURL, puts); err != nil {
					mu.Lock()
					if firstEr == nil {
						firstEr = err
					}
					mu.Unlock()
					cancel()
					return
				}
			}
		})
	}
	start := time.Now()
	for b := 0; b < n && ctx.Err() == nil; b += seedTxnServices {
		select {
		case batches <- b:
		case <-ctx.Done():
		}
		if b > 0 && b%10000 == 0 {
			logf("load: %d/%d Services written to etcd in %v", b, n, time.Since(start).Round(time.Second))
		}
	}
	close(batches)
	wg.Wait()
	if firstEr != nil {
		return firstEr
	}
	return ctx.Err()
}

// etcdTxn commits puts in one transaction through etcd's gRPC gateway.
func etcdTxn(ctx context.Context, c *http.Client, etcdURL string, puts []kv) error {
	body, err := txnBody(puts)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, etcdURL+"/v3/kv/txn", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("etcd txn: %w", err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd txn: %s: %s", resp.Status, bytes.TrimSpace(out))
	}
	var r struct {
		Succeeded bool `json:"succeeded"`
	}
	if err := json.Unmarshal(out, &r); err != nil || !r.Succeeded {
		return fmt.Errorf("etcd txn: not applied: %s", bytes.TrimSpace(out))
	}
	return nil
}
