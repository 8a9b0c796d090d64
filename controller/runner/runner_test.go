package runner

import (
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// recorder counts calls of the sync function and can fail them.
type recorder struct {
	mu    sync.Mutex
	calls []time.Time
	fail  bool
	clk   *clocktesting.FakeClock
	ran   chan struct{}
}

func (r *recorder) fn() error {
	r.mu.Lock()
	r.calls = append(r.calls, r.clk.Now())
	fail := r.fail
	r.mu.Unlock()
	r.ran <- struct{}{}
	if fail {
		return errors.New("boom")
	}
	return nil
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func start(t *testing.T, fail bool, minI, maxI, retry time.Duration) (*recorder, *Runner) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	rec := &recorder{clk: clk, fail: fail, ran: make(chan struct{}, 100)}
	r := New(rec.fn, minI, maxI, retry, clk)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go r.Run(stop)
	<-rec.ran // the first sync runs at once
	return rec, r
}

// waitTimer waits until the runner sleeps on its timer.
func waitTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("runner never waited")
		}
		time.Sleep(time.Millisecond)
	}
}

func expectRun(t *testing.T, rec *recorder) {
	t.Helper()
	select {
	case <-rec.ran:
	case <-time.After(5 * time.Second):
		t.Fatal("no sync ran")
	}
}

func expectNoRun(t *testing.T, rec *recorder) {
	t.Helper()
	select {
	case <-rec.ran:
		t.Fatal("an unexpected sync ran")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestBurstMergesIntoOneSyncAfterMinInterval(t *testing.T) {
	rec, r := start(t, false, time.Second, time.Hour, 0)
	waitTimer(t, rec.clk)
	for range 10 {
		r.Trigger()
	}
	expectNoRun(t, rec) // min interval not over yet
	waitTimer(t, rec.clk)
	rec.clk.Step(time.Second)
	expectRun(t, rec)
	expectNoRun(t, rec)
	if got := rec.count(); got != 2 {
		t.Errorf("syncs = %d, want 2 (start + one for the burst)", got)
	}
}

func TestTriggerAfterMinIntervalRunsAtOnce(t *testing.T) {
	rec, r := start(t, false, time.Second, time.Hour, 0)
	waitTimer(t, rec.clk)
	rec.clk.Step(2 * time.Second)
	r.Trigger()
	expectRun(t, rec)
}

func TestPeriodicSync(t *testing.T) {
	rec, _ := start(t, false, time.Second, 30*time.Second, 0)
	waitTimer(t, rec.clk)
	rec.clk.Step(29 * time.Second)
	expectNoRun(t, rec)
	waitTimer(t, rec.clk)
	rec.clk.Step(time.Second)
	expectRun(t, rec)
}

func TestRetryAfterFailure(t *testing.T) {
	rec, _ := start(t, true, time.Second, time.Hour, 5*time.Second)
	waitTimer(t, rec.clk)
	rec.clk.Step(5 * time.Second)
	expectRun(t, rec)
}

// TestStopDuringSync: a stop that arrives while a sync runs, with a trigger
// pending and the periodic sync due, ends Run as soon as that sync returns,
// without another call (SIGTERM in the middle of a long sync).
func TestStopDuringSync(t *testing.T) {
	for i := 0; i < 50; i++ { // select picks at random: repeat
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		var calls int
		var r *Runner
		stop := make(chan struct{})
		release := make(chan struct{})
		r = New(func() error {
			calls++
			if calls == 1 {
				r.Trigger()
				close(stop)
				<-release
			}
			return errors.New("killed")
		}, 0, time.Nanosecond, time.Nanosecond, clk)
		done := make(chan struct{})
		go func() { r.Run(stop); close(done) }()
		clk.Step(time.Second) // the retry is due as well
		close(release)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after stop")
		}
		if calls != 1 {
			t.Fatalf("fn called %d times, want 1: a sync started after stop", calls)
		}
	}
}
