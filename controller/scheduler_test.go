package controller

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestParseScheduler(t *testing.T) {
	for _, in := range []string{"rr", "wrr", "lc", "wlc", "sh", "mh", " WRR "} {
		if _, err := ParseScheduler(in); err != nil {
			t.Errorf("ParseScheduler(%q): %v", in, err)
		}
	}
	for _, in := range []string{"", "random", "wrr,rr", "dh"} {
		if v, err := ParseScheduler(in); err == nil {
			t.Errorf("ParseScheduler(%q) = %q, want an error", in, v)
		}
	}
}

// The annotation reaches every port of its Service; an unknown value is a
// Problem like a bad weight and keeps the last valid scheduler.
func TestBuildScheduler(t *testing.T) {
	const ns = "demo"
	sls := []*discoveryv1.EndpointSlice{
		makeSlice(ns, "web", "web-a", []discoveryv1.Endpoint{ready("198.19.1.1", "web-1")}, nil),
	}
	twoPorts := func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP})
	}
	b := NewBuilder()
	st, problems := b.Build([]*corev1.Service{
		makeService(ns, "web", all(twoPorts, withAnnotation(AnnotationScheduler, "mh"))),
		makeService(ns, "plain", withIP("198.18.0.2")),
	}, sls)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	got := map[string]string{}
	for _, sp := range st.Services {
		got[sp.Name.String()] = sp.Scheduler
	}
	want := map[string]string{"demo/web:http": "mh", "demo/web:dns": "mh", "demo/plain:http": ""}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("schedulers = %v, want %v", got, want)
	}

	st, problems = b.Build([]*corev1.Service{
		makeService(ns, "web", all(twoPorts, withAnnotation(AnnotationScheduler, "fastest"))),
		makeService(ns, "plain", all(withIP("198.18.0.2"), withAnnotation(AnnotationScheduler, "bogus"))),
	}, sls)
	wantProblems := []string{
		`demo/plain: annotation steelyard.io/ipvs-scheduler: unknown IPVS scheduler "bogus" (want one of rr, wrr, lc, wlc, sh, mh)`,
		`demo/web: annotation steelyard.io/ipvs-scheduler: unknown IPVS scheduler "fastest" (want one of rr, wrr, lc, wlc, sh, mh)`,
	}
	if got := problemStrings(problems); !reflect.DeepEqual(got, wantProblems) {
		t.Fatalf("problems:\n got %q\nwant %q", got, wantProblems)
	}
	for _, sp := range st.Services {
		if w := map[string]string{"web": "mh", "plain": ""}[sp.Name.Name]; sp.Scheduler != w {
			t.Errorf("%s: scheduler %q after an invalid annotation, want the last valid %q", sp.Name, sp.Scheduler, w)
		}
	}
}
