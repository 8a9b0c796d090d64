// Package gatewayconformance runs the upstream Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance, the release in go.mod) against a
// cluster with steelyard; `make gateway-conformance` brings up the real node
// and passes the flags (see scripts/gateway-conformance/run.sh).
package gatewayconformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

// TestConformance is the upstream entry point; its flags (--gateway-class,
// --conformance-profiles, --report-output, ...) come from
// sigs.k8s.io/gateway-api/conformance/utils/flags.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
