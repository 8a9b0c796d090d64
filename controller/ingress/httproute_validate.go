package ingress

import (
	"fmt"
	"regexp"
	"strings"

	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// internalPrefix is the path of the internal locations the HTTPRoute
// renderer dispatches to; no route may use it.
const internalPrefix = "/.steelyard/"

// The allow-lists for HTTPRoute values, as narrow as validate.go's: none
// admits a quote, '\', '$', ';', '{', '}', '#' or a control character, so no
// value can end a string, a directive or a block, or expand a variable.
var (
	// Header names become nginx variables ($http_x_foo) and directive
	// arguments: letters, digits and '-'.
	headerNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,127}$`)
	// Query parameter names become $arg_NAME: letters, digits and '_'.
	queryNameRE = regexp.MustCompile(`^[A-Za-z0-9_]{1,128}$`)
	// Header and query values: printable ASCII and spaces, without the
	// characters above.
	headerValueRE = regexp.MustCompile(`^[A-Za-z0-9 ._~:/?=&,+*!@()%<>|-]*$`)
	// Redirect codes nginx's "return CODE URL" sends with a Location:
	// 301 and 302 are core, 303, 307 and 308 extended features.
	redirectCodes = map[int]bool{301: true, 302: true, 303: true, 307: true, 308: true}
	methods       = map[gwv1.HTTPMethod]bool{"GET": true, "HEAD": true, "POST": true, "PUT": true, "DELETE": true, "CONNECT": true, "OPTIONS": true, "TRACE": true, "PATCH": true}
)

// ValidateHTTPRoute checks every value of an HTTPRoute that would reach
// nginx.conf and that steelyard supports; the first error rejects the whole
// route (the Gateway translation reports it as Accepted=False,
// UnsupportedValue, and Render skips it).
func ValidateHTTPRoute(r *gwv1.HTTPRoute) error {
	if err := validName("namespace", r.Namespace); err != nil {
		return err
	}
	if err := validName("HTTPRoute", r.Name); err != nil {
		return err
	}
	for _, h := range r.Spec.Hostnames {
		if err := validHost(string(h)); err != nil {
			return err
		}
	}
	for i, rule := range r.Spec.Rules {
		if err := validRule(rule); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
	}
	return nil
}

func validRule(rule gwv1.HTTPRouteRule) error {
	prefixOnly := true // no matches: PathPrefix /
	for _, m := range rule.Matches {
		if m.Path != nil {
			typ := gwv1.PathMatchPathPrefix
			if m.Path.Type != nil {
				typ = *m.Path.Type
			}
			if typ != gwv1.PathMatchExact && typ != gwv1.PathMatchPathPrefix {
				return fmt.Errorf("path match type %q: steelyard supports Exact and PathPrefix", typ)
			}
			if typ == gwv1.PathMatchExact {
				prefixOnly = false
			}
			if m.Path.Value != nil {
				if err := validRoutePath(*m.Path.Value); err != nil {
					return err
				}
			}
		}
		for _, h := range m.Headers {
			if h.Type != nil && *h.Type != gwv1.HeaderMatchExact {
				return fmt.Errorf("header match type %q: steelyard supports Exact", *h.Type)
			}
			if err := validHeader(string(h.Name), h.Value); err != nil {
				return err
			}
		}
		for _, q := range m.QueryParams {
			if q.Type != nil && *q.Type != gwv1.QueryParamMatchExact {
				return fmt.Errorf("query param match type %q: steelyard supports Exact", *q.Type)
			}
			if !queryNameRE.MatchString(string(q.Name)) {
				return fmt.Errorf("query param name %q: want letters, digits and _", q.Name)
			}
			if len(q.Value) > 1024 || !headerValueRE.MatchString(q.Value) {
				return fmt.Errorf("query param %s value %q: unsupported characters", q.Name, q.Value)
			}
		}
		if m.Method != nil && !methods[*m.Method] {
			return fmt.Errorf("method %q: unknown", *m.Method)
		}
	}
	redirect := false
	for _, f := range rule.Filters {
		switch f.Type {
		case gwv1.HTTPRouteFilterRequestHeaderModifier, gwv1.HTTPRouteFilterResponseHeaderModifier:
			hf := f.RequestHeaderModifier
			if f.Type == gwv1.HTTPRouteFilterResponseHeaderModifier {
				hf = f.ResponseHeaderModifier
			}
			if hf == nil {
				return fmt.Errorf("filter %s without its settings", f.Type)
			}
			for _, h := range append(append([]gwv1.HTTPHeader(nil), hf.Set...), hf.Add...) {
				if err := validHeader(string(h.Name), h.Value); err != nil {
					return fmt.Errorf("filter %s: %w", f.Type, err)
				}
			}
			for _, n := range hf.Remove {
				if err := validHeader(n, ""); err != nil {
					return fmt.Errorf("filter %s: %w", f.Type, err)
				}
			}
		case gwv1.HTTPRouteFilterRequestRedirect:
			rr := f.RequestRedirect
			if rr == nil {
				return fmt.Errorf("filter %s without its settings", f.Type)
			}
			redirect = true
			if rr.Scheme != nil && *rr.Scheme != "http" && *rr.Scheme != "https" {
				return fmt.Errorf("redirect scheme %q: want http or https", *rr.Scheme)
			}
			if rr.Hostname != nil {
				if err := validHost(string(*rr.Hostname)); err != nil || strings.HasPrefix(string(*rr.Hostname), "*") {
					return fmt.Errorf("redirect hostname %q: want a lower-case DNS name", *rr.Hostname)
				}
			}
			if rr.StatusCode != nil && !redirectCodes[*rr.StatusCode] {
				return fmt.Errorf("redirect statusCode %d: want 301, 302, 303, 307 or 308", *rr.StatusCode)
			}
			if rr.Port != nil && (*rr.Port < 1 || *rr.Port > 65535) {
				return fmt.Errorf("redirect port %d: want 1 to 65535", *rr.Port)
			}
			if err := validModifier(rr.Path, prefixOnly); err != nil {
				return fmt.Errorf("redirect: %w", err)
			}
		case gwv1.HTTPRouteFilterURLRewrite:
			uw := f.URLRewrite
			if uw == nil {
				return fmt.Errorf("filter %s without its settings", f.Type)
			}
			if uw.Hostname != nil {
				if err := validHost(string(*uw.Hostname)); err != nil || strings.HasPrefix(string(*uw.Hostname), "*") {
					return fmt.Errorf("rewrite hostname %q: want a lower-case DNS name", *uw.Hostname)
				}
			}
			if err := validModifier(uw.Path, prefixOnly); err != nil {
				return fmt.Errorf("rewrite: %w", err)
			}
		default:
			return fmt.Errorf("filter %q: steelyard supports RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect and URLRewrite", f.Type)
		}
	}
	if redirect && len(rule.BackendRefs) > 0 {
		return fmt.Errorf("a RequestRedirect rule cannot have backendRefs")
	}
	for _, b := range rule.BackendRefs {
		if len(b.Filters) > 0 {
			return fmt.Errorf("backendRef %s: backendRef filters are not supported", b.Name)
		}
	}
	return nil
}

func validRoutePath(p string) error {
	if err := validPath(p); err != nil {
		return err
	}
	if strings.HasPrefix(p+"/", internalPrefix) {
		return fmt.Errorf("path %q: %s is reserved for steelyard's internal locations", p, internalPrefix)
	}
	return nil
}

func validModifier(m *gwv1.HTTPPathModifier, prefixOnly bool) error {
	if m == nil {
		return nil
	}
	switch m.Type {
	case gwv1.FullPathHTTPPathModifier:
		if m.ReplaceFullPath == nil {
			return fmt.Errorf("ReplaceFullPath without a value")
		}
		return validPath(*m.ReplaceFullPath)
	case gwv1.PrefixMatchHTTPPathModifier:
		if m.ReplacePrefixMatch == nil {
			return fmt.Errorf("ReplacePrefixMatch without a value")
		}
		if !prefixOnly {
			return fmt.Errorf("ReplacePrefixMatch needs PathPrefix matches only")
		}
		return validPath(*m.ReplacePrefixMatch)
	}
	return fmt.Errorf("path modifier type %q: want ReplaceFullPath or ReplacePrefixMatch", m.Type)
}

func validHeader(name, value string) error {
	if !headerNameRE.MatchString(name) {
		return fmt.Errorf("header name %q: want letters, digits and -", name)
	}
	if len(value) > 1024 || !headerValueRE.MatchString(value) {
		return fmt.Errorf("header %s value %q: unsupported characters (no quotes, \\, $, ;, {, }, # or control characters)", name, value)
	}
	return nil
}
