// Package alerts checks the example Prometheus rules of docs/operations.md
// with Prometheus' own PromQL engine on synthetic series (make
// alerts-check). It is a Go module of its own so that Prometheus'
// dependencies stay out of the agent's go.mod.
package alerts
