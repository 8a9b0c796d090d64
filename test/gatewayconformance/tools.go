//go:build tools

package gatewayconformance

// The backend image of the suite is built from this package at the same
// version (scripts/gateway-conformance/images.sh).
import _ "sigs.k8s.io/gateway-api/conformance/echo-basic"
