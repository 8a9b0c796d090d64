//go:build ipvsvm

package ipvs

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// logStamper follows an agent's log file and stamps each new line with the
// moment it appeared. The agent's own timestamps have one-second
// resolution, too coarse for a timeline of a repair that takes 1-3 s.
type logStamper struct {
	path       string
	mu         sync.Mutex
	lines      []stampedLine
	stop, done chan struct{}
}

type stampedLine struct {
	at   time.Time
	text string
}

// stampLog starts following path (every 10 ms) until Stop. The lines
// already there are stamped with the zero time: before any moment asked.
func stampLog(path string) *logStamper {
	s := &logStamper{path: path, stop: make(chan struct{}), done: make(chan struct{})}
	var off int
	var partial string
	if b, err := os.ReadFile(path); err == nil {
		off = len(b)
		parts := strings.Split(string(b), "\n")
		partial = parts[len(parts)-1]
		for _, l := range parts[:len(parts)-1] {
			s.lines = append(s.lines, stampedLine{time.Time{}, l})
		}
	}
	go func() {
		defer close(s.done)
		for {
			if b, err := os.ReadFile(s.path); err == nil && len(b) > off {
				now := time.Now()
				text := partial + string(b[off:])
				off = len(b)
				parts := strings.Split(text, "\n")
				partial = parts[len(parts)-1]
				s.mu.Lock()
				for _, l := range parts[:len(parts)-1] {
					s.lines = append(s.lines, stampedLine{now, l})
				}
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return s
}

// Stop ends the following.
func (s *logStamper) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// since returns the lines that appeared after t0, each prefixed with its
// offset from t0; only those containing one of the filters when given.
func (s *logStamper) since(t0 time.Time, filters ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		if l.at.Before(t0) {
			continue
		}
		keep := len(filters) == 0
		for _, f := range filters {
			keep = keep || strings.Contains(l.text, f)
		}
		if keep {
			out = append(out, fmt.Sprintf("%+7.3fs %s", l.at.Sub(t0).Seconds(), l.text))
		}
	}
	return out
}

// first returns when the first line after t0 containing sub appeared.
func (s *logStamper) first(t0 time.Time, subs ...string) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if l.at.Before(t0) {
			continue
		}
		for _, sub := range subs {
			if strings.Contains(l.text, sub) {
				return l.at.Sub(t0), true
			}
		}
	}
	return 0, false
}

// lagMeter measures how late a 5 ms sleep of this process wakes up: under
// TCG on a loaded host the guest's vCPUs get a fraction of a core, and
// every wall-clock figure of the round then measures the host, not the
// agent (seen here: 1.4 s late timers at a host load average of 71, and a
// 4.7 s `ipvsadm -C` at 18).
type lagMeter struct {
	max        atomic.Int64
	mu         sync.Mutex
	starved    []time.Time // when a sleep woke more than chaosStarved late
	stop, done chan struct{}
}

func startLagMeter() *lagMeter {
	l := &lagMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			t := time.Now()
			time.Sleep(5 * time.Millisecond)
			d := time.Since(t) - 5*time.Millisecond
			if int64(d) > l.max.Load() {
				l.max.Store(int64(d))
			}
			if d > chaosStarved {
				l.mu.Lock()
				l.starved = append(l.starved, time.Now())
				l.mu.Unlock()
			}
		}
	}()
	return l
}

// Stop ends the measuring and returns the largest lag seen.
func (l *lagMeter) Stop() time.Duration {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	return time.Duration(l.max.Load())
}

// starvedWithin reports whether the VM was starved of CPU at some moment
// of [from, to]: a late wake-up ends inside it, or up to its lag after.
func (l *lagMeter) starvedWithin(from, to time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.starved {
		if !at.Before(from) && !at.After(to.Add(time.Duration(l.max.Load()))) {
			return true
		}
	}
	return false
}

// excuse splits a Prober's failures (each "15:04:05.000 error", ending
// then, after at most timeout) into those to judge and the timeouts of
// dials during which the VM was starved of CPU: those say nothing about
// the dataplane.
func (l *lagMeter) excuse(failures []string, timeout time.Duration) (judged, excused []string) {
	for _, e := range failures {
		end, ok := failureTime(e)
		if ok && strings.Contains(e, "timeout") && l.starvedWithin(end.Add(-timeout), end) {
			excused = append(excused, e)
			continue
		}
		judged = append(judged, e)
	}
	return judged, excused
}

// failureTime parses the time a Prober failure line starts with (today).
func failureTime(e string) (time.Time, bool) {
	f := strings.Fields(e)
	if len(f) == 0 {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("15:04:05.000", f[0], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	now := time.Now()
	return time.Date(now.Year(), now.Month(), now.Day(), at.Hour(), at.Minute(), at.Second(), at.Nanosecond(), time.Local), true
}
