// Package runner runs the agent's sync function at a bounded frequency:
// bursts of changes merge into one sync, syncs start at most once per
// MinInterval on average (a token bucket of Burst syncs, refilled one per
// MinInterval), a sync runs at least every MaxInterval (the periodic
// resync), and a failed sync is retried after RetryInterval. The clock is
// injected so tests never sleep.
//
// The bucket is kube-proxy's BoundedFrequencyRunner idea: the first change
// after a quiet moment runs at once even if another sync (a periodic one, or
// the nftables dataplane's stale-chain cleanup a second after each change)
// started less than MinInterval ago; only a sustained stream of changes is
// held to one sync per MinInterval.
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
	burst       int
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
		burst: 1, clock: clk, trigger: make(chan struct{}, 1),
	}
}

// SetBurst lets up to n syncs start back to back before MinInterval holds
// them apart (n < 1 counts as 1: every two syncs at least MinInterval
// apart). Call it before Run.
func (r *Runner) SetBurst(n int) { r.burst = max(n, 1) }

// bucket is the token bucket of sync starts, counted in time so the
// arithmetic is exact: credit at time at, one token per minInterval of
// credit, refilled by the time that passes, up to burst tokens.
type bucket struct {
	credit time.Duration
	at     time.Time
}

// level returns the credit at now.
func (r *Runner) level(b bucket, now time.Time) time.Duration {
	return min(time.Duration(r.burst)*r.minInterval, b.credit+now.Sub(b.at))
}

// untilToken returns how long until a whole token is in the bucket.
func (r *Runner) untilToken(b bucket, now time.Time) time.Duration {
	return max(r.minInterval-r.level(b, now), 0)
}

// Trigger asks for a sync as soon as the bucket allows. Many triggers
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
	// The bucket starts full; every sync start (triggered, periodic or a
	// retry) takes a token, or what is left of one.
	b := bucket{credit: time.Duration(r.burst) * r.minInterval, at: r.clock.Now()}
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
		if pending && r.level(b, now) >= r.minInterval || !now.Before(next) {
			pending = false
			b = bucket{credit: max(r.level(b, now)-r.minInterval, 0), at: now}
			if err := r.fn(); err != nil {
				next = now.Add(r.retry)
			} else {
				next = now.Add(r.maxInterval)
			}
			continue
		}
		wait := next.Sub(now)
		if pending {
			wait = min(wait, r.untilToken(b, now))
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
