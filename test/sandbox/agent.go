package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrAgentExited is returned by Stop when the agent had already exited.
var ErrAgentExited = errors.New("agent had already exited")

// AgentStopTimeout is how long Stop waits after SIGTERM before SIGKILL.
var AgentStopTimeout = 10 * time.Second

// Agent is a steelyard process running in the node namespace.
type Agent struct {
	// LogPath is the file receiving the agent's standard output and error.
	LogPath string
	Argv    []string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, valid once done is closed
}

// StartAgent starts `binary args...` in the node namespace with
// `ip netns exec` (which execs, so the PID is the agent's) and its output
// going to a log file in the sandbox directory. Close stops it.
func (s *Sandbox) StartAgent(binary string, args ...string) (*Agent, error) {
	abs, err := filepath.Abs(binary)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("sandbox: closed")
	}
	k := len(s.agents) + 1
	s.mu.Unlock()
	logPath := filepath.Join(s.Dir, fmt.Sprintf("agent-%d.log", k))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	argv := append([]string{abs}, args...)
	cmd := exec.Command("ip", append([]string{"netns", "exec", s.Node.Name}, argv...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	a := &Agent{LogPath: logPath, Argv: argv, cmd: cmd, done: make(chan struct{})}
	go func() {
		a.err = cmd.Wait()
		close(a.done)
	}()
	s.mu.Lock()
	s.agents = append(s.agents, a)
	s.mu.Unlock()
	s.logf("sandbox %s: agent %d started (pid %d): %s; log %s", s.Name, k, cmd.Process.Pid, strings.Join(argv, " "), logPath)
	return a, nil
}

// Pid returns the agent's process ID.
func (a *Agent) Pid() int { return a.cmd.Process.Pid }

// Done is closed when the agent has exited.
func (a *Agent) Done() <-chan struct{} { return a.done }

// Exited reports whether the agent has exited, and with what (nil for exit 0).
func (a *Agent) Exited() (bool, error) {
	select {
	case <-a.done:
		return true, a.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits for the agent to exit (SIGKILL after
// AgentStopTimeout). It returns nil for a clean exit 0, the exit error
// otherwise, and ErrAgentExited (wrapping the earlier result) if the agent
// was no longer running.
func (a *Agent) Stop() error {
	select {
	case <-a.done:
		if a.err != nil {
			return fmt.Errorf("%w: %v", ErrAgentExited, a.err)
		}
		return ErrAgentExited
	default:
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
		return a.err
	case <-time.After(AgentStopTimeout):
		a.cmd.Process.Kill()
		<-a.done
		return fmt.Errorf("agent ignored SIGTERM for %s and was killed", AgentStopTimeout)
	}
}

// Log returns the agent's output so far.
func (a *Agent) Log() string {
	b, err := os.ReadFile(a.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", a.LogPath, err)
	}
	return string(b)
}

// Agents returns the agents started in this sandbox.
func (s *Sandbox) Agents() []*Agent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Agent(nil), s.agents...)
}

// LogLinesBetween returns the last max lines of an agent log (logrus
// text, time="RFC 3339") stamped from from to to.
func LogLinesBetween(log string, from, to time.Time, max int) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		_, rest, ok := strings.Cut(l, `time="`)
		if !ok {
			continue
		}
		stamp, _, ok := strings.Cut(rest, `"`)
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339, stamp)
		if err != nil || at.Before(from.Truncate(time.Second)) || at.After(to) {
			continue
		}
		out = append(out, l)
	}
	if len(out) > max {
		out = append([]string{"..."}, out[len(out)-max:]...)
	}
	return out
}
