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
func (s *logStamper) first(t0 time.Time, sub string) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lines {
		if !l.at.Before(t0) && strings.Contains(l.text, sub) {
			return l.at.Sub(t0), true
		}
	}
	return 0, false
}

// lagMeter measures how late a 5 ms sleep of this process wakes up: under
// TCG on a loaded host the guest's vCPUs get a fraction of a core, and
// every wall-clock figure of the round then measures the host, not the
// agent (seen here: 1.4 s late timers at a host load average of 71).
type lagMeter struct {
	max        atomic.Int64
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
			if d := int64(time.Since(t) - 5*time.Millisecond); d > l.max.Load() {
				l.max.Store(d)
			}
		}
	}()
	return l
}

// Stop ends the measuring and returns the largest lag seen.
func (l *lagMeter) Stop() time.Duration {
	close(l.stop)
	<-l.done
	return time.Duration(l.max.Load())
}
