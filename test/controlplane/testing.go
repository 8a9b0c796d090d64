package controlplane

import (
	"context"
	"testing"
	"time"
)

// Option configures Start.
type Option func(*Options)

// WithReducedAPIs starts kube-apiserver with ReducedRuntimeConfig.
func WithReducedAPIs() Option { return func(o *Options) { o.ReducedAPIs = true } }

// WithAPIServerArgs appends arguments to kube-apiserver's.
func WithAPIServerArgs(args ...string) Option {
	return func(o *Options) { o.APIServerArgs = append(o.APIServerArgs, args...) }
}

// WithReadyTimeout sets how long each process may take to become ready.
func WithReadyTimeout(d time.Duration) Option { return func(o *Options) { o.ReadyTimeout = d } }

// WithBinaries runs the given executables instead of FindBinaries'.
func WithBinaries(b Binaries) Option { return func(o *Options) { o.Binaries = b } }

// Start starts a control plane for a test. Missing binaries fail the test
// (t.Fatal, never Skip) with the command that builds them. Progress goes to
// t.Logf. Stop is registered with t.Cleanup, which also runs when the test
// fails or panics; when the test failed, the cleanup first logs the tail of
// both processes' logs.
func Start(t testing.TB, opts ...Option) *ControlPlane {
	t.Helper()
	var o Options
	for _, opt := range opts {
		opt(&o)
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	if o.Binaries.KubeAPIServer == "" {
		b, err := FindBinaries()
		if err != nil {
			t.Fatal(err)
		}
		o.Binaries = b
	}
	cp, err := StartProcess(context.Background(), o)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs (%s):\n%s", cp.Dir, cp.Logs(40))
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("control plane stop: %v", err)
		}
	})
	return cp
}
