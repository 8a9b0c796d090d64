// Package runner runs the agent's sync function at a bounded frequency:
// bursts of changes merge into one sync, syncs are at least MinInterval
// apart, a sync runs at least every MaxInterval (the periodic resync), and a
// failed sync is retried after RetryInterval. The clock is injected so tests
// never sleep.
package runner

import (
	"time"

	"k8s.io/utils/clock"
)

// Runner schedules calls of one function.
type Runner struct {
	fn          func() error
	minInterval time.Duration
	maxInterval time.Duration
	retry       time.Duration
	clock       clock.Clock
	trigger     chan struct{}
}

// New returns a Runner for fn. retry <= 0 means retry after minInterval
// (or one second if that is longer); maxInterval <= 0 means one hour.
func New(fn func() error, minInterval, maxInterval, retry time.Duration, clk clock.Clock) *Runner {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if retry <= 0 {
		retry = max(minInterval, time.Second)
	}
	if maxInterval <= 0 {
		maxInterval = time.Hour
	}
	return &Runner{
		fn: fn, minInterval: minInterval, maxInterval: maxInterval, retry: retry,
		clock: clk, trigger: make(chan struct{}, 1),
	}
}

// Trigger asks for a sync as soon as MinInterval allows. Many triggers
// before the sync starts merge into one.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run calls fn once at once, then as scheduled, until stop is closed. A call
// in progress when stop closes is not interrupted by Run: fn ends it (the
// agent's kernel children are killed on shutdown, see internal/execx), and
// Run then returns without calling fn again.
func (r *Runner) Run(stop <-chan struct{}) {
	var last time.Time
	pending := true // the first sync runs at once
	var timer clock.Timer
	next := r.clock.Now()
	for {
		// Stop wins over a pending trigger or an expired timer: after
		// shutdown no new sync starts (select picks at random among ready
		// cases, so the check cannot be left to it).
		select {
		case <-stop:
			if timer != nil {
				timer.Stop()
			}
			return
		default:
		}
		now := r.clock.Now()
		if pending && (last.IsZero() || now.Sub(last) >= r.minInterval) || !now.Before(next) {
			pending = false
			last = r.clock.Now()
			if err := r.fn(); err != nil {
				next = last.Add(r.retry)
			} else {
				next = last.Add(r.maxInterval)
			}
			continue
		}
		wait := next.Sub(now)
		if pending {
			wait = min(wait, last.Add(r.minInterval).Sub(now))
		}
		if timer == nil {
			timer = r.clock.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-stop:
			timer.Stop()
			return
		case <-r.trigger:
			pending = true
			if !timer.Stop() {
				select {
				case <-timer.C():
				default:
				}
			}
		case <-timer.C():
		}
	}
}
