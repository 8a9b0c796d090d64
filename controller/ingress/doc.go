// Package ingress is steelyard's thin L7 layer: it turns networking.k8s.io/v1
// Ingresses of the steelyard IngressClass into an nginx.conf and runs nginx
// as a child process.
//
// The point of the design: an upstream is the Service's ClusterIP:port
// (keepalive connections to the VIP), so pod churn only changes the kernel
// rules the agent writes, and nginx is never reloaded for it. nginx's own
// controller lists pod IPs and reloads on every endpoint change; that
// behaviour is kept as a baseline (Options.Upstreams = "pods") so a
// benchmark can compare both in one run.
//
// Three stages, as in the rest of the agent: informers (controller.go) poke
// a bounded-frequency runner; Render (render.go) turns one snapshot into
// the whole nginx.conf and the certificate files, validating everything
// that comes from the API (validate.go) so nothing can inject a directive;
// Nginx (nginx.go) tests the text with `nginx -t`, swaps it in atomically and
// reloads only when the text changed.
//
// Path semantics follow the Ingress spec: Exact matches the path only;
// Prefix matches by path element (/foo matches /foo and /foo/bar, not
// /foobar); across the Ingresses of one host the longest match wins, and an
// Exact path beats a Prefix path of the same text. ImplementationSpecific is
// treated as Prefix.
package ingress
