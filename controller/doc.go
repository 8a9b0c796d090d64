// Package controller turns Kubernetes Services and EndpointSlices into the
// desired dataplane.State that every steelyard dataplane programs.
//
// The package has three concerns, each in one file:
//
//   - weights.go: the annotation contract (parsing and formatting only);
//   - build.go: the one place where objects become effective weights
//     (which Services, which endpoints, precedence of weights, the readiness
//     rule, splits across Services);
//   - manifests.go: the standalone source that reads objects from a directory
//     of YAML/JSON files instead of the API server.
package controller

import "github.com/sirupsen/logrus"

// log is the package's logger; every line carries subsys=controller.
var log = logrus.WithField("subsys", "controller")

// Field keys of structured log lines, kept constant so logs can be queried.
const (
	fieldSvc        = "svc"
	fieldSlice      = "slice"
	fieldPort       = "port"
	fieldVIP        = "vip"
	fieldBackend    = "backend"
	fieldAnnotation = "annotation"
	fieldFile       = "file"
	fieldKind       = "kind"
	fieldDoc        = "doc"
	fieldServices   = "services"
	fieldProblems   = "problems"
)
