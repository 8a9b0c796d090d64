package ingress

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// FuzzHTTPRouteValues: any value that passes ValidateHTTPRoute renders
// without tripping the template's own checks (quote, valueQuote panic on
// an unsafe value), and a refused route leaves no trace in the text.
func FuzzHTTPRouteValues(f *testing.F) {
	for _, s := range []string{"/a", "v1", `a"b`, "x;y", "$x", "~^a", "a b", "/a/../b", "default", "{", "a\nb", "%41", "*.x.com"} {
		f.Add(s, s, s, s)
	}
	f.Fuzz(func(t *testing.T, path, hname, hvalue, host string) {
		r := httpRoute("fz", 0, []gwv1.Hostname{gwv1.Hostname(host)}, gwv1.HTTPRouteRule{
			Matches: []gwv1.HTTPRouteMatch{{Path: pathMatch(gwv1.PathMatchPathPrefix, path),
				Headers:     []gwv1.HTTPHeaderMatch{{Name: gwv1.HTTPHeaderName(hname), Value: hvalue}},
				QueryParams: []gwv1.HTTPQueryParamMatch{{Name: gwv1.HTTPHeaderName(hname), Value: hvalue}}}},
			Filters: []gwv1.HTTPRouteFilter{
				{Type: gwv1.HTTPRouteFilterRequestHeaderModifier, RequestHeaderModifier: &gwv1.HTTPHeaderFilter{
					Set: []gwv1.HTTPHeader{{Name: gwv1.HTTPHeaderName(hname), Value: hvalue}}, Add: []gwv1.HTTPHeader{{Name: gwv1.HTTPHeaderName(hname), Value: hvalue}}}},
				{Type: gwv1.HTTPRouteFilterURLRewrite, URLRewrite: &gwv1.HTTPURLRewriteFilter{
					Path: &gwv1.HTTPPathModifier{Type: gwv1.PrefixMatchHTTPPathModifier, ReplacePrefixMatch: ptr.To(path)}}},
			},
		})
		h := host
		if h == "" {
			h = "x.example"
		}
		out := Render(Input{Settings: DefaultSettings(), HTTPRoutes: []HTTPRoute{{Route: r,
			Attach: []HTTPAttachment{{Port: 8080, Hostnames: []string{h}}}, Backends: [][]HTTPBackend{{vipBackend("198.18.0.10", 1)}}}}}, Options{Dir: testDir})
		if ValidateHTTPRoute(r) != nil {
			if len(out.Problems) == 0 || strings.Contains(out.Text, "default/fz") {
				t.Fatalf("refused route rendered or not reported: %v", out.Problems)
			}
		}
	})
}
