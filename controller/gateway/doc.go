// Package gateway serves the Gateway API (sigs.k8s.io/gateway-api v1.6)
// at L4: TCPRoutes and UDPRoutes attached to TCP/UDP listeners of Gateways
// of the GatewayClass whose controllerName is ControllerName, and routes
// whose parent is a Service (GAMMA).
//
// Three stages, as in the rest of the agent: typed informers (source.go)
// poke the agent's sync runner; Translate (translate.go) turns one snapshot
// into controller.Routes, which the Builder turns into Service ports with
// the code path of the steelyard.io/split annotation (backendRef weight
// across Services, endpoint weights inside each), so every dataplane
// serves routes unchanged and a route weight change takes the sync path of
// an annotation change; the same Result carries the status every object
// should have, which StatusWriter (status.go) writes from the one agent
// that holds a Lease.
package gateway
