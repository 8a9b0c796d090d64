package sandbox

import (
	"sync/atomic"
	"time"
)

// LagWatch measures how late a periodic sleep wakes up: how long this
// process (or the VM it runs in) was starved of CPU while it ran.
type LagWatch struct {
	max  atomic.Int64
	stop chan struct{}
	done chan struct{}
}

// WatchLag starts a goroutine that sleeps period again and again and keeps
// the largest delay past it. Call Stop.
func WatchLag(period time.Duration) *LagWatch {
	w := &LagWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTimer(period)
		defer t.Stop()
		for {
			want := time.Now().Add(period)
			t.Reset(period)
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			if late := time.Since(want); int64(late) > w.max.Load() {
				w.max.Store(int64(late))
			}
		}
	}()
	return w
}

// Stop ends the watch and returns the largest lateness seen.
func (w *LagWatch) Stop() time.Duration {
	close(w.stop)
	<-w.done
	return time.Duration(w.max.Load())
}
