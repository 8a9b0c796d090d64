package controller

// Test IP plan (only ranges reserved for benchmarking and documentation, so a
// test never looks like a real cluster's addresses; never 10/8, 172.16/12 or
// 192.168/16):
//
//	Service clusterIPs   198.18.0.0/16   198.18.0.<n>, one n per Service
//	Pod IPs              198.19.0.0/16   198.19.<n>.<pod>, n = the Service's
//	IPv6 (skipped today) 2001:db8::/32
//
// Service ports are 80 (named "http") unless a case says otherwise; pods
// listen on 8080.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/steelyard-net/steelyard/dataplane"
)

func TestMain(m *testing.M) {
	// Problems are logged as warnings: show them only with -v.
	flag.Parse()
	if !testing.Verbose() {
		logrus.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}

// makeService returns a ClusterIP Service with one TCP port "http" 80 and a
// UID derived from its name; tweak adjusts it.
func makeService(ns, name string, tweak func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name)},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: "198.18.0.1",
			Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	if tweak != nil {
		tweak(svc)
	}
	return svc
}

// makeSlice returns an IPv4 EndpointSlice of Service svc with one TCP port
// "http" 8080 and the given endpoints; tweak adjusts it.
func makeSlice(ns, svc, name string, eps []discoveryv1.Endpoint, tweak func(*discoveryv1.EndpointSlice)) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(ns + "/slice/" + name),
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{slicePortOf("http", 8080, corev1.ProtocolTCP)},
	}
	if tweak != nil {
		tweak(sl)
	}
	return sl
}

func slicePortOf(name string, port int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto}
}

// Endpoint conditions, spelled the way tests read best.
const (
	condReady       = "ready"       // ready, serving (Serving nil)
	condNotReady    = "not-ready"   // not ready, not serving
	condTerminating = "terminating" // serving and terminating
	condGone        = "gone"        // terminating, not serving
	condUnknown     = "unknown"     // all conditions nil
)

// endpoint returns an endpoint of pod (no targetRef when pod is "") at ip.
func endpoint(ip, pod, cond string) discoveryv1.Endpoint {
	t, f := true, false
	ep := discoveryv1.Endpoint{Addresses: []string{ip}}
	switch cond {
	case condReady:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: &t}
	case condNotReady:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: &f}
	case condTerminating:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: &f, Serving: &t, Terminating: &t}
	case condGone:
		ep.Conditions = discoveryv1.EndpointConditions{Ready: &f, Serving: &f, Terminating: &t}
	case condUnknown:
	default:
		panic("unknown condition " + cond)
	}
	if pod != "" {
		ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "demo", Name: pod}
	}
	return ep
}

func ready(ip, pod string) discoveryv1.Endpoint { return endpoint(ip, pod, condReady) }

// backend is the expected Backend at addr ("ip:port") with the flags of cond.
func backend(addr, pod string, weight float64, cond string) dataplane.Backend {
	ap := netip.MustParseAddrPort(addr)
	b := dataplane.Backend{IP: ap.Addr(), Port: ap.Port(), Name: pod, Weight: weight}
	switch cond {
	case condReady, condUnknown:
		b.Ready, b.Serving = true, true
	case condNotReady:
	case condTerminating:
		b.Serving, b.Terminating = true, true
	case condGone:
		b.Terminating = true
	}
	return b
}

func withAnnotation(key, value string) func(*corev1.Service) {
	return func(s *corev1.Service) { annotate(&s.ObjectMeta, key, value) }
}

func annotate(m *metav1.ObjectMeta, key, value string) {
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[key] = value
}

func withIP(ip string) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.ClusterIP = ip }
}

func all(tweaks ...func(*corev1.Service)) func(*corev1.Service) {
	return func(s *corev1.Service) {
		for _, t := range tweaks {
			t(s)
		}
	}
}

func sliceAnnotation(key, value string) func(*discoveryv1.EndpointSlice) {
	return func(s *discoveryv1.EndpointSlice) { annotate(&s.ObjectMeta, key, value) }
}

// byName indexes a state's ports by "ns/name:port".
func byName(st dataplane.State) map[string]dataplane.ServicePort {
	out := map[string]dataplane.ServicePort{}
	for _, sp := range st.Services {
		out[sp.Name.String()] = sp
	}
	return out
}

func problemStrings(ps []Problem) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Error()
	}
	return out
}

func sortedBackends(bs []dataplane.Backend) []dataplane.Backend {
	sp := dataplane.ServicePort{Backends: append([]dataplane.Backend(nil), bs...)}
	st := dataplane.State{Services: []dataplane.ServicePort{sp}}
	st.Sort()
	return st.Services[0].Backends
}

func TestBuild(t *testing.T) {
	const ns = "demo"
	tests := []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		// want maps "ns/name:port" to its backends (any order); a port not
		// listed must not be in the state.
		want         map[string][]dataplane.Backend
		wantVIPs     map[string]string // optional: "ns/name:port" -> VIP
		wantNodePort map[string]uint16 // optional: "ns/name:port" -> node port
		wantProblems []string
	}{
		{
			name:     "10/90 by pod name",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=10,web-2=90"))},
			slices:   []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2")}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 10, condReady),
				backend("198.19.1.2:8080", "web-2", 90, condReady),
			}},
			wantVIPs: map[string]string{"demo/web:http": "198.18.0.1:80/TCP"},
		},
		{
			name:     "by IP, endpoint without targetRef",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "198.19.1.1=10, 198.19.1.2=90"))},
			slices:   []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", ""), ready("198.19.1.2", "web-2")}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "", 10, condReady),
				backend("198.19.1.2:8080", "web-2", 90, condReady),
			}},
		},
		{
			name:     "star is the weight of the others",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=5,*=2"))},
			slices:   []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2"), ready("198.19.1.3", "web-3")}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 5, condReady),
				backend("198.19.1.2:8080", "web-2", 2, condReady),
				backend("198.19.1.3:8080", "web-3", 2, condReady),
			}},
		},
		{
			name:     "slice weight, unannotated slice gets 1",
			services: []*corev1.Service{makeService(ns, "web", nil)},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, sliceAnnotation(AnnotationSliceWeight, "3")),
				makeSlice(ns, "web", "web-b", []discoveryv1.Endpoint{ready("198.19.1.2", "web-2")}, nil),
			},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 3, condReady),
				backend("198.19.1.2:8080", "web-2", 1, condReady),
			}},
		},
		{
			name:     "cilium weight",
			services: []*corev1.Service{makeService(ns, "web", nil)},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, sliceAnnotation(AnnotationCiliumWeight, "4")),
				makeSlice(ns, "web", "web-b", []discoveryv1.Endpoint{ready("198.19.1.2", "web-2")}, nil),
			},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 4, condReady),
				backend("198.19.1.2:8080", "web-2", 1, condReady),
			}},
		},
		{
			// pod name > IP > slice steelyard > slice cilium > "*" > 1.
			name: "precedence",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=10,198.19.1.2=20,web-2=30,198.19.1.5=50,*=4")),
				makeService(ns, "plain", withIP("198.18.0.2")),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{
					ready("198.19.1.1", "web-1"), // pod name
					ready("198.19.1.2", "web-2"), // pod name beats its IP
					ready("198.19.1.3", "web-3"), // slice steelyard beats cilium and *
					ready("198.19.1.5", "web-5"), // IP beats slice
				}, all2(sliceAnnotation(AnnotationSliceWeight, "7"), sliceAnnotation(AnnotationCiliumWeight, "9"))),
				makeSlice(ns, "web", "web-b", []discoveryv1.Endpoint{ready("198.19.1.4", "web-4")}, sliceAnnotation(AnnotationCiliumWeight, "9")),
				makeSlice(ns, "web", "web-c", []discoveryv1.Endpoint{ready("198.19.1.6", "web-6")}, nil),
				makeSlice(ns, "plain", "plain-a", []discoveryv1.Endpoint{ready("198.19.2.1", "plain-1")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {
					backend("198.19.1.1:8080", "web-1", 10, condReady),
					backend("198.19.1.2:8080", "web-2", 30, condReady),
					backend("198.19.1.3:8080", "web-3", 7, condReady),
					backend("198.19.1.4:8080", "web-4", 9, condReady),
					backend("198.19.1.5:8080", "web-5", 50, condReady),
					backend("198.19.1.6:8080", "web-6", 4, condReady),
				},
				"demo/plain:http": {backend("198.19.2.1:8080", "plain-1", 1, condReady)},
			},
		},
		{
			name:     "weight 0 drains but stays",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=0"))},
			slices:   []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2")}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 0, condReady),
				backend("198.19.1.2:8080", "web-2", 1, condReady),
			}},
		},
		{
			name:     "not ready gets 0, nil conditions are ready",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "*=5"))},
			slices: []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{
				endpoint("198.19.1.1", "web-1", condNotReady),
				endpoint("198.19.1.2", "web-2", condUnknown),
				endpoint("198.19.1.3", "web-3", condTerminating),
			}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 0, condNotReady),
				backend("198.19.1.2:8080", "web-2", 5, condUnknown),
				backend("198.19.1.3:8080", "web-3", 0, condTerminating),
			}},
		},
		{
			name:     "terminating fallback when none is ready",
			services: []*corev1.Service{makeService(ns, "web", withAnnotation(AnnotationWeights, "web-2=3"))},
			slices: []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{
				endpoint("198.19.1.1", "web-1", condNotReady),
				endpoint("198.19.1.2", "web-2", condTerminating),
				endpoint("198.19.1.3", "web-3", condTerminating),
				endpoint("198.19.1.4", "web-4", condGone),
			}, nil)},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 0, condNotReady),
				backend("198.19.1.2:8080", "web-2", 3, condTerminating),
				backend("198.19.1.3:8080", "web-3", 1, condTerminating),
				backend("198.19.1.4:8080", "web-4", 0, condGone),
			}},
		},
		{
			name:     "no endpoints: the port is there, empty",
			services: []*corev1.Service{makeService(ns, "web", nil)},
			want:     map[string][]dataplane.Backend{"demo/web:http": nil},
		},
		{
			name: "slice selection: namespace, family, port name and protocol, label",
			services: []*corev1.Service{makeService(ns, "web", func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{
					{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP},
					{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
				}
			})},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{
						slicePortOf("http", 8080, corev1.ProtocolTCP),
						slicePortOf("dns", 5353, corev1.ProtocolUDP),
						slicePortOf("dns", 5300, corev1.ProtocolTCP), // wrong protocol
					}
				}),
				makeSlice("other", "web", "web-a", []discoveryv1.Endpoint{ready("198.19.9.1", "x")}, nil),
				makeSlice(ns, "web", "web-v6", []discoveryv1.Endpoint{ready("2001:db8::1", "web-1")}, func(s *discoveryv1.EndpointSlice) {
					s.AddressType = discoveryv1.AddressTypeIPv6
				}),
				makeSlice(ns, "web", "web-fqdn", []discoveryv1.Endpoint{ready("web.example.org", "web-1")}, func(s *discoveryv1.EndpointSlice) {
					s.AddressType = discoveryv1.AddressTypeFQDN
				}),
				makeSlice(ns, "web", "web-unlabelled", []discoveryv1.Endpoint{ready("198.19.9.2", "y")}, func(s *discoveryv1.EndpointSlice) {
					s.Labels = nil
				}),
				makeSlice(ns, "web", "web-other-port", []discoveryv1.Endpoint{ready("198.19.9.3", "z")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{slicePortOf("metrics", 9090, corev1.ProtocolTCP)}
				}),
				makeSlice(ns, "web", "web-bad-addr", []discoveryv1.Endpoint{ready("not-an-ip", "w"), ready("2001:db8::2", "v")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {backend("198.19.1.1:8080", "web-1", 1, condReady)},
				"demo/web:dns":  {backend("198.19.1.1:5353", "web-1", 1, condReady)},
			},
			wantVIPs: map[string]string{"demo/web:dns": "198.18.0.1:53/UDP"},
		},
		{
			name: "unnamed port, no protocol means TCP, nil slice port name",
			services: []*corev1.Service{makeService(ns, "web", func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Port: 8000}}
			})},
			slices: []*discoveryv1.EndpointSlice{makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, func(s *discoveryv1.EndpointSlice) {
				p := int32(8080)
				s.Ports = []discoveryv1.EndpointPort{{Port: &p}}
			})},
			want:     map[string][]dataplane.Backend{"demo/web:8000": {backend("198.19.1.1:8080", "web-1", 1, condReady)}},
			wantVIPs: map[string]string{"demo/web:8000": "198.18.0.1:8000/TCP"},
		},
		{
			name:     "every address is a backend, duplicates kept once, not-terminating copy preferred",
			services: []*corev1.Service{makeService(ns, "web", nil)},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{
					{Addresses: []string{"198.19.1.1", "198.19.1.2"}, TargetRef: &corev1.ObjectReference{Name: "web-1"}},
					endpoint("198.19.1.3", "old", condTerminating),
				}, nil),
				makeSlice(ns, "web", "web-b", []discoveryv1.Endpoint{
					ready("198.19.1.1", "web-1"),
					ready("198.19.1.3", "new"),
				}, sliceAnnotation(AnnotationSliceWeight, "6")),
			},
			want: map[string][]dataplane.Backend{"demo/web:http": {
				backend("198.19.1.1:8080", "web-1", 1, condUnknown),
				backend("198.19.1.2:8080", "web-1", 1, condUnknown),
				backend("198.19.1.3:8080", "new", 6, condReady),
			}},
		},
		{
			name: "skipped Services",
			services: []*corev1.Service{
				makeService(ns, "headless", withIP(corev1.ClusterIPNone)),
				makeService(ns, "external", func(s *corev1.Service) {
					s.Spec.Type = corev1.ServiceTypeExternalName
					s.Spec.ClusterIP = ""
					s.Spec.ExternalName = "example.org"
				}),
				makeService(ns, "noip", withIP("")),
				makeService(ns, "badip", withIP("198.18.0.300")),
				makeService(ns, "v6", withIP("2001:db8::10")),
				makeService(ns, "sctp", func(s *corev1.Service) {
					s.Spec.ClusterIP = "198.18.0.3"
					s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "sig", Port: 2905, Protocol: corev1.ProtocolSCTP})
				}),
			},
			want: map[string][]dataplane.Backend{"demo/sctp:http": nil, "demo/sctp:sig": nil},
			wantProblems: []string{
				`demo/badip: invalid clusterIP "198.18.0.300", Service skipped`,
				"demo/noip: no clusterIP, Service skipped",
			},
		},
		{
			// An SCTP port is built like TCP and UDP ones; the slice port
			// must match its name and protocol (a TCP "sig" is another port).
			name: "SCTP port: weights, node port, slice port by protocol",
			services: []*corev1.Service{makeService(ns, "sig", func(s *corev1.Service) {
				s.Spec.ClusterIP = "198.18.0.4"
				s.Spec.Type = corev1.ServiceTypeNodePort
				s.Spec.Ports = []corev1.ServicePort{{Name: "sig", Port: 2905, NodePort: 30905, Protocol: corev1.ProtocolSCTP}}
				annotate(&s.ObjectMeta, AnnotationWeights, "sig-1=10,sig-2=90")
			})},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "sig", "sig-a", []discoveryv1.Endpoint{ready("198.19.4.1", "sig-1"), ready("198.19.4.2", "sig-2")}, func(sl *discoveryv1.EndpointSlice) {
					sl.Ports = []discoveryv1.EndpointPort{slicePortOf("sig", 3905, corev1.ProtocolTCP), slicePortOf("sig", 2905, corev1.ProtocolSCTP)}
				}),
				makeSlice(ns, "sig", "sig-tcp", []discoveryv1.Endpoint{ready("198.19.4.3", "sig-3")}, func(sl *discoveryv1.EndpointSlice) {
					sl.Ports = []discoveryv1.EndpointPort{slicePortOf("sig", 2905, corev1.ProtocolTCP)}
				}),
			},
			want: map[string][]dataplane.Backend{"demo/sig:sig": {
				backend("198.19.4.1:2905", "sig-1", 10, condReady),
				backend("198.19.4.2:2905", "sig-2", 90, condReady),
			}},
			wantVIPs:     map[string]string{"demo/sig:sig": "198.18.0.4:2905/SCTP"},
			wantNodePort: map[string]uint16{"demo/sig:sig": 30905},
		},
		{
			name: "duplicate port name (manifests only): first wins",
			services: []*corev1.Service{makeService(ns, "web", func(s *corev1.Service) {
				s.Spec.Ports = []corev1.ServicePort{{Port: 80}, {Port: 80, Protocol: corev1.ProtocolUDP}}
			})},
			want:         map[string][]dataplane.Backend{"demo/web:80": nil},
			wantVIPs:     map[string]string{"demo/web:80": "198.18.0.1:80/TCP"},
			wantProblems: []string{`demo/web: port "80": name used twice, port skipped`},
		},
		{
			name: "duplicate objects (manifests only): first wins",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationWeights, "*=2")),
				makeService(ns, "web", withAnnotation(AnnotationWeights, "*=3")),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, nil),
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.2", "web-2")}, nil),
			},
			want: map[string][]dataplane.Backend{"demo/web:http": {backend("198.19.1.1:8080", "web-1", 2, condReady)}},
			wantProblems: []string{
				"demo/web: duplicate Service, the first one is used",
				"demo/web: EndpointSlice web-a: duplicate EndpointSlice, the first one is used",
			},
		},
		{
			name: "duplicate VIP: first by name wins",
			services: []*corev1.Service{
				makeService(ns, "b", nil),
				makeService(ns, "a", nil),
			},
			want:         map[string][]dataplane.Backend{"demo/a:http": nil},
			wantProblems: []string{"demo/b: port http: VIP 198.18.0.1:80/TCP is already used by demo/a:http, port skipped"},
		},
		{
			// stable: weights 1 and 3 by its own annotation; canary: one pod.
			name: "split 90/10",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationSplit, "web-stable=90,web-canary=10")),
				makeService(ns, "web-stable", all(withIP("198.18.0.2"), withAnnotation(AnnotationWeights, "stable-2=3"))),
				makeService(ns, "web-canary", withIP("198.18.0.3")),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, nil), // not used
				makeSlice(ns, "web-stable", "web-stable-a", []discoveryv1.Endpoint{ready("198.19.2.1", "stable-1"), ready("198.19.2.2", "stable-2")}, nil),
				makeSlice(ns, "web-canary", "web-canary-a", []discoveryv1.Endpoint{ready("198.19.3.1", "canary-1")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {
					backend("198.19.2.1:8080", "stable-1", 90.0*1/4, condReady),
					backend("198.19.2.2:8080", "stable-2", 90.0*3/4, condReady),
					backend("198.19.3.1:8080", "canary-1", 10.0*1/1, condReady),
				},
				"demo/web-stable:http": {
					backend("198.19.2.1:8080", "stable-1", 1, condReady),
					backend("198.19.2.2:8080", "stable-2", 3, condReady),
				},
				"demo/web-canary:http": {backend("198.19.3.1:8080", "canary-1", 1, condReady)},
			},
		},
		{
			name: "split with an empty, a missing and a drained Service",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationSplit, "web-stable=90,web-canary=10,web-gone=50,web-drained=30")),
				makeService(ns, "web-stable", withIP("198.18.0.2")),
				makeService(ns, "web-canary", withIP("198.18.0.3")),
				makeService(ns, "web-drained", all(withIP("198.18.0.4"), withAnnotation(AnnotationWeights, "*=0"))),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web-stable", "web-stable-a", []discoveryv1.Endpoint{ready("198.19.2.1", "stable-1")}, nil),
				makeSlice(ns, "web-canary", "web-canary-a", []discoveryv1.Endpoint{endpoint("198.19.3.1", "canary-1", condNotReady)}, nil),
				makeSlice(ns, "web-drained", "web-drained-a", []discoveryv1.Endpoint{ready("198.19.4.1", "drained-1")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {
					backend("198.19.2.1:8080", "stable-1", 90, condReady),
					backend("198.19.3.1:8080", "canary-1", 0, condNotReady),
					backend("198.19.4.1:8080", "drained-1", 0, condReady),
				},
				"demo/web-stable:http":  {backend("198.19.2.1:8080", "stable-1", 1, condReady)},
				"demo/web-canary:http":  {backend("198.19.3.1:8080", "canary-1", 0, condNotReady)},
				"demo/web-drained:http": {backend("198.19.4.1:8080", "drained-1", 0, condReady)},
			},
		},
		{
			// web has http and metrics. "named" matches both by name (its
			// numbers differ); "single" has one port and serves both; "udp"
			// has one UDP port and serves neither.
			name: "split port by name and by only port",
			services: []*corev1.Service{
				makeService(ns, "web", func(s *corev1.Service) {
					annotate(&s.ObjectMeta, AnnotationSplit, "named=1,single=1,udp=1")
					s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "metrics", Port: 9090}}
				}),
				makeService(ns, "named", func(s *corev1.Service) {
					s.Spec.ClusterIP = "198.18.0.2"
					s.Spec.Ports = []corev1.ServicePort{{Name: "metrics", Port: 19090}, {Name: "http", Port: 8000}}
				}),
				makeService(ns, "single", func(s *corev1.Service) {
					s.Spec.ClusterIP = "198.18.0.3"
					s.Spec.Ports = []corev1.ServicePort{{Name: "web", Port: 81}}
				}),
				makeService(ns, "udp", func(s *corev1.Service) {
					s.Spec.ClusterIP = "198.18.0.4"
					s.Spec.Ports = []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolUDP}}
				}),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "named", "named-a", []discoveryv1.Endpoint{ready("198.19.2.1", "named-1")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{slicePortOf("http", 8080, ""), slicePortOf("metrics", 9100, "")}
				}),
				makeSlice(ns, "single", "single-a", []discoveryv1.Endpoint{ready("198.19.3.1", "single-1")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{slicePortOf("web", 8081, corev1.ProtocolTCP)}
				}),
				makeSlice(ns, "udp", "udp-a", []discoveryv1.Endpoint{ready("198.19.4.1", "udp-1")}, func(s *discoveryv1.EndpointSlice) {
					s.Ports = []discoveryv1.EndpointPort{slicePortOf("http", 8080, corev1.ProtocolUDP)}
				}),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {
					backend("198.19.2.1:8080", "named-1", 1, condReady),
					backend("198.19.3.1:8081", "single-1", 1, condReady),
				},
				"demo/web:metrics": {
					backend("198.19.2.1:9100", "named-1", 1, condReady),
					backend("198.19.3.1:8081", "single-1", 1, condReady),
				},
				"demo/named:metrics": {backend("198.19.2.1:9100", "named-1", 1, condReady)},
				"demo/named:http":    {backend("198.19.2.1:8080", "named-1", 1, condReady)},
				"demo/single:web":    {backend("198.19.3.1:8081", "single-1", 1, condReady)},
				"demo/udp:http":      {backend("198.19.4.1:8080", "udp-1", 1, condReady)},
			},
		},
		{
			// web names itself (weights from its own annotation) and
			// web-canary, whose own split to web-other is not followed;
			// web-zero gets part 0.
			name: "split naming itself, no recursion, part 0, shared endpoint",
			services: []*corev1.Service{
				makeService(ns, "web", all(
					withAnnotation(AnnotationSplit, "web=60,web-canary=40,web-zero=0"),
					withAnnotation(AnnotationWeights, "web-2=2"))),
				makeService(ns, "web-canary", all(withIP("198.18.0.2"), withAnnotation(AnnotationSplit, "web-other=1"))),
				makeService(ns, "web-other", withIP("198.18.0.3")),
				makeService(ns, "web-zero", withIP("198.18.0.4")),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2")}, nil),
				// web-canary's selector also picks web-2.
				makeSlice(ns, "web-canary", "web-canary-a", []discoveryv1.Endpoint{ready("198.19.2.1", "canary-1"), ready("198.19.1.2", "web-2")}, nil),
				makeSlice(ns, "web-other", "web-other-a", []discoveryv1.Endpoint{ready("198.19.3.1", "other-1")}, nil),
				makeSlice(ns, "web-zero", "web-zero-a", []discoveryv1.Endpoint{ready("198.19.4.1", "zero-1")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http": {
					backend("198.19.1.1:8080", "web-1", 60.0*1/3, condReady),
					backend("198.19.1.2:8080", "web-2", 60.0*2/3+40.0*1/2, condReady),
					backend("198.19.2.1:8080", "canary-1", 40.0*1/2, condReady),
					backend("198.19.4.1:8080", "zero-1", 0, condReady),
				},
				"demo/web-canary:http": {backend("198.19.3.1:8080", "other-1", 1, condReady)},
				"demo/web-other:http":  {backend("198.19.3.1:8080", "other-1", 1, condReady)},
				"demo/web-zero:http":   {backend("198.19.4.1:8080", "zero-1", 1, condReady)},
			},
		},
		{
			name: "split to a headless Service uses its endpoints",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationSplit, "web-pods=1")),
				makeService(ns, "web-pods", withIP(corev1.ClusterIPNone)),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web-pods", "web-pods-a", []discoveryv1.Endpoint{ready("198.19.2.1", "pod-1")}, nil),
			},
			want: map[string][]dataplane.Backend{"demo/web:http": {backend("198.19.2.1:8080", "pod-1", 1, condReady)}},
		},
		{
			name: "bad annotations without history are absent, others unaffected",
			services: []*corev1.Service{
				makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=1,web-1=2")),
				makeService(ns, "api", all(withIP("198.18.0.2"), withAnnotation(AnnotationWeights, "api-1=7"))),
				makeService(ns, "split", all(withIP("198.18.0.3"), withAnnotation(AnnotationSplit, "api=1,"))),
			},
			slices: []*discoveryv1.EndpointSlice{
				makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, all2(
					sliceAnnotation(AnnotationSliceWeight, "x"), sliceAnnotation(AnnotationCiliumWeight, "5"))),
				makeSlice(ns, "api", "api-a", []discoveryv1.Endpoint{ready("198.19.2.1", "api-1")}, nil),
				makeSlice(ns, "split", "split-a", []discoveryv1.Endpoint{ready("198.19.3.1", "split-1")}, nil),
			},
			want: map[string][]dataplane.Backend{
				"demo/web:http":   {backend("198.19.1.1:8080", "web-1", 5, condReady)}, // cilium's, since steelyard's is bad
				"demo/api:http":   {backend("198.19.2.1:8080", "api-1", 7, condReady)},
				"demo/split:http": {backend("198.19.3.1:8080", "split-1", 1, condReady)}, // own endpoints
			},
			wantProblems: []string{
				"demo/split: annotation steelyard.io/split: element 2 is empty (stray comma?)",
				`demo/web: annotation steelyard.io/weights: duplicate key "web-1"`,
				`demo/web: EndpointSlice web-a: annotation steelyard.io/weight: weight "x" is not a decimal integer`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, problems := NewBuilder().Build(tc.services, tc.slices)
			got := byName(st)
			for name, want := range tc.want {
				sp, ok := got[name]
				if !ok {
					t.Errorf("%s missing from the state", name)
					continue
				}
				if !reflect.DeepEqual(sp.Backends, sortedBackends(want)) {
					t.Errorf("%s backends:\n got %v\nwant %v", name, sp.Backends, sortedBackends(want))
				}
				if vip, ok := tc.wantVIPs[name]; ok && sp.VIP.String() != vip {
					t.Errorf("%s VIP = %s, want %s", name, sp.VIP, vip)
				}
				if np, ok := tc.wantNodePort[name]; ok && sp.NodePort != np {
					t.Errorf("%s node port = %d, want %d", name, sp.NodePort, np)
				}
			}
			for name := range got {
				if _, ok := tc.want[name]; !ok {
					t.Errorf("unexpected %s in the state", name)
				}
			}
			if gotP := problemStrings(problems); !reflect.DeepEqual(gotP, append([]string{}, tc.wantProblems...)) {
				t.Errorf("problems:\n got %q\nwant %q", gotP, tc.wantProblems)
			}
		})
	}
}

func all2(tweaks ...func(*discoveryv1.EndpointSlice)) func(*discoveryv1.EndpointSlice) {
	return func(s *discoveryv1.EndpointSlice) {
		for _, t := range tweaks {
			t(s)
		}
	}
}

// TestSplitSharesExact checks the split arithmetic with exact float
// comparisons: part * w / sum, with no rounding beyond the division.
func TestSplitSharesExact(t *testing.T) {
	const ns = "demo"
	services := []*corev1.Service{
		makeService(ns, "web", withAnnotation(AnnotationSplit, "web-stable=90,web-canary=10")),
		makeService(ns, "web-stable", all(withIP("198.18.0.2"), withAnnotation(AnnotationWeights, "s-1=1,s-2=2,s-3=4"))),
		makeService(ns, "web-canary", withIP("198.18.0.3")),
	}
	slices := []*discoveryv1.EndpointSlice{
		makeSlice(ns, "web-stable", "s", []discoveryv1.Endpoint{ready("198.19.2.1", "s-1"), ready("198.19.2.2", "s-2"), ready("198.19.2.3", "s-3")}, nil),
		makeSlice(ns, "web-canary", "c", []discoveryv1.Endpoint{ready("198.19.3.1", "c-1"), ready("198.19.3.2", "c-2"), ready("198.19.3.3", "c-3")}, nil),
	}
	st, problems := NewBuilder().Build(services, slices)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	sp := byName(st)["demo/web:http"]
	want := map[string]float64{
		"198.19.2.1": 90.0 * 1 / 7,
		"198.19.2.2": 90.0 * 2 / 7,
		"198.19.2.3": 90.0 * 4 / 7,
		"198.19.3.1": 10.0 * 1 / 3,
		"198.19.3.2": 10.0 * 1 / 3,
		"198.19.3.3": 10.0 * 1 / 3,
	}
	var total float64
	for _, b := range sp.Backends {
		if w := want[b.IP.String()]; b.Weight != w {
			t.Errorf("%s weight = %v, want exactly %v", b.IP, b.Weight, w)
		}
		total += b.Weight
	}
	if got := sp.TotalWeight(); got != total || total < 99.999999 || total > 100.000001 {
		t.Errorf("total weight = %v", got)
	}
	// The stable Service receives 90% of the connections.
	var stable float64
	for _, b := range sp.Backends {
		if strings.HasPrefix(b.IP.String(), "198.19.2.") {
			stable += b.Weight
		}
	}
	if share := stable / sp.TotalWeight(); share < 0.9-1e-12 || share > 0.9+1e-12 {
		t.Errorf("stable share = %v, want 0.9", share)
	}
}

func TestBuilderKeepsLastValidAnnotations(t *testing.T) {
	const ns = "demo"
	slices := []*discoveryv1.EndpointSlice{
		makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2")}, nil),
		makeSlice(ns, "web", "web-b", []discoveryv1.Endpoint{ready("198.19.1.3", "web-3")}, nil),
		makeSlice(ns, "web-canary", "web-canary-a", []discoveryv1.Endpoint{ready("198.19.2.1", "canary-1")}, nil),
		makeSlice(ns, "api", "api-a", []discoveryv1.Endpoint{ready("198.19.3.1", "api-1")}, nil),
	}
	// Generation 1: every annotation valid.
	gen := func(weights, split, sliceW, ciliumW, apiWeights string) ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
		svcs := []*corev1.Service{
			makeService(ns, "web", all(withAnnotation(AnnotationWeights, weights), withAnnotation(AnnotationSplit, split))),
			makeService(ns, "web-canary", withIP("198.18.0.2")),
			makeService(ns, "api", all(withIP("198.18.0.3"), withAnnotation(AnnotationWeights, apiWeights))),
		}
		sls := make([]*discoveryv1.EndpointSlice, len(slices))
		for i, s := range slices {
			sls[i] = s.DeepCopy()
		}
		annotate(&sls[1].ObjectMeta, AnnotationSliceWeight, sliceW)
		annotate(&sls[1].ObjectMeta, AnnotationCiliumWeight, ciliumW)
		return svcs, sls
	}
	b := NewBuilder()
	svcs, sls := gen("web-1=3,*=2", "web=80,web-canary=20", "5", "6", "api-1=4")
	st1, problems := b.Build(svcs, sls)
	if len(problems) != 0 {
		t.Fatalf("generation 1 problems: %v", problems)
	}

	// Generation 2: all four annotations on web broken; api changes validly.
	svcs, sls = gen("web-1=3,web-1=4", "web=80,,", "five", "-6", "api-1=9")
	st2, problems := b.Build(svcs, sls)
	wantProblems := []string{
		`demo/web: annotation steelyard.io/split: element 2 is empty (stray comma?)`,
		`demo/web: annotation steelyard.io/weights: duplicate key "web-1"`,
		`demo/web: EndpointSlice web-b: annotation service.cilium.io/weight: weight "-6" is not a decimal integer`,
		`demo/web: EndpointSlice web-b: annotation steelyard.io/weight: weight "five" is not a decimal integer`,
	}
	if got := problemStrings(problems); !reflect.DeepEqual(got, wantProblems) {
		t.Fatalf("generation 2 problems:\n got %q\nwant %q", got, wantProblems)
	}
	if a, b := byName(st1)["demo/web:http"], byName(st2)["demo/web:http"]; !reflect.DeepEqual(a, b) {
		t.Errorf("web changed although its new annotations are invalid:\n gen1 %v\n gen2 %v", a, b)
	}
	if got := byName(st2)["demo/api:http"].Backends[0].Weight; got != 9 {
		t.Errorf("api weight = %v, want the new valid 9", got)
	}
	// Generation 3: still broken; memory is kept across Builds.
	st3, _ := b.Build(svcs, sls)
	if !reflect.DeepEqual(st2, st3) {
		t.Errorf("generation 3 differs from 2:\n%v\n%v", st2, st3)
	}
	// The remembered value of the slice weight is 5 (steelyard's), not 6.
	for _, be := range byName(st3)["demo/web:http"].Backends {
		if be.Name == "web-3" && be.Weight != 80.0*5/(3+2+5) {
			t.Errorf("web-3 weight = %v, want %v", be.Weight, 80.0*5/(3+2+5))
		}
	}
}

func TestBuilderPrunesAndStartsFresh(t *testing.T) {
	const ns = "demo"
	slices := []*discoveryv1.EndpointSlice{
		makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1"), ready("198.19.1.2", "web-2")}, nil),
	}
	good := makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=9"))
	bad := makeService(ns, "web", withAnnotation(AnnotationWeights, "web-1=nine"))
	weightOfWeb1 := func(st dataplane.State) float64 {
		for _, b := range byName(st)["demo/web:http"].Backends {
			if b.Name == "web-1" {
				return b.Weight
			}
		}
		t.Fatalf("web-1 missing: %v", st)
		return 0
	}

	t.Run("deleted then recreated with a bad annotation", func(t *testing.T) {
		b := NewBuilder()
		b.Build([]*corev1.Service{good}, slices)
		b.Build(nil, slices) // the Service is gone: its memory is pruned
		if len(b.services) != 0 {
			t.Fatalf("memory not pruned: %v", b.services)
		}
		st, problems := b.Build([]*corev1.Service{bad}, slices)
		if w := weightOfWeb1(st); w != 1 || len(problems) != 1 {
			t.Errorf("weight = %v, problems %v; want 1 (annotation absent) and one problem", w, problems)
		}
	})
	t.Run("recreated between two Builds (new UID)", func(t *testing.T) {
		b := NewBuilder()
		b.Build([]*corev1.Service{good}, slices)
		recreated := bad.DeepCopy()
		recreated.UID = "demo/web-2nd"
		st, _ := b.Build([]*corev1.Service{recreated}, slices)
		if w := weightOfWeb1(st); w != 1 {
			t.Errorf("weight = %v, want 1: a new object must not inherit memory", w)
		}
	})
	t.Run("annotation removed then broken", func(t *testing.T) {
		b := NewBuilder()
		b.Build([]*corev1.Service{good}, slices)
		b.Build([]*corev1.Service{makeService(ns, "web", nil)}, slices)
		st, _ := b.Build([]*corev1.Service{bad}, slices)
		if w := weightOfWeb1(st); w != 1 {
			t.Errorf("weight = %v, want 1: absence was the last valid value", w)
		}
	})
	t.Run("same object keeps memory", func(t *testing.T) {
		b := NewBuilder()
		b.Build([]*corev1.Service{good}, slices)
		st, _ := b.Build([]*corev1.Service{bad}, slices)
		if w := weightOfWeb1(st); w != 9 {
			t.Errorf("weight = %v, want the last valid 9", w)
		}
	})
}

func TestBuildIsDeterministic(t *testing.T) {
	const ns = "demo"
	var services []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := 1; i <= 20; i++ {
		name := fmt.Sprintf("svc-%02d", i)
		services = append(services, makeService(ns, name, all(
			withIP(fmt.Sprintf("198.18.0.%d", i)),
			withAnnotation(AnnotationWeights, fmt.Sprintf("*=%d", i)))))
		for j := 1; j <= 3; j++ {
			slices = append(slices, makeSlice(ns, name, fmt.Sprintf("%s-%d", name, j), []discoveryv1.Endpoint{
				ready(fmt.Sprintf("198.19.%d.%d", i, j), fmt.Sprintf("%s-pod-%d", name, j)),
			}, nil))
		}
	}
	services = append(services, makeService(ns, "broken", all(withIP(""), withAnnotation(AnnotationSplit, "x=")))) // two problems
	want, wantP := NewBuilder().Build(services, slices)
	r := rand.New(rand.NewSource(1))
	for n := 0; n < 10; n++ {
		r.Shuffle(len(services), func(i, j int) { services[i], services[j] = services[j], services[i] })
		r.Shuffle(len(slices), func(i, j int) { slices[i], slices[j] = slices[j], slices[i] })
		got, gotP := NewBuilder().Build(services, slices)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(problemStrings(gotP), problemStrings(wantP)) {
			t.Fatalf("output depends on input order")
		}
	}
	if len(want.Services) != 21-1 || len(wantP) != 2 {
		t.Errorf("got %d ports and %d problems", len(want.Services), len(wantP))
	}
}

func TestProblemError(t *testing.T) {
	base := errors.New(`duplicate key "pod1"`)
	p := Problem{Namespace: "demo", Name: "web", Kind: KindService, Object: "web", Annotation: AnnotationWeights, Err: base}
	if got, want := p.Error(), `demo/web: annotation steelyard.io/weights: duplicate key "pod1"`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(p, base) {
		t.Errorf("Problem does not unwrap to its error")
	}
	p = Problem{Namespace: "demo", Name: "web", Kind: KindEndpointSlice, Object: "web-abc", Annotation: AnnotationSliceWeight, Err: base}
	if got, want := p.Error(), `demo/web: EndpointSlice web-abc: annotation steelyard.io/weight: duplicate key "pod1"`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
